"""How fast is each gradient-sync strategy of course_lib.core next to torch DDP?

    python scripts/bench_data_parallel.py              # full run, a few minutes
    python scripts/bench_data_parallel.py --quick      # under a minute
    python scripts/bench_data_parallel.py --out .bench --bucket-mb 25,1 --nproc 2

Runs ``scripts/bench_data_parallel_worker.py`` on ``--nproc`` processes (Gloo on CPU,
NCCL with one GPU per process) for the tiny transformer of ``course_lib.tasks.models`` (~27k
parameters: latency and Python overhead dominate) and a wide MLP (13.7M parameters, 55 MB of
gradients: bytes dominate), at each bucket size, with the same bucket size for DDP. Every
configuration trains its own copy of the same model; they take turns so that a slow spell of
the machine hits them alike. Prints the table and writes ``bench_data_parallel.json`` and
``bench_data_parallel.png`` into ``--out``.

Configurations: ``ddp`` (torch DDP, defaults but the bucket size), ``ddp views`` (DDP with
``gradient_as_bucket_view=True``), our strategies (``course_lib.train.syncs.SYNCS``), and
``no sync`` (no communication at all: the floor). Ratios are median step times over DDP's;
``hidden`` is the share of overlap's communication time that fell inside backward (from its
own timeline).

The findings on this course's machines, and what was tried, are in the README (Performance).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from course_lib.lessons.timeline import plot_timeline  # noqa: E402
from course_lib.runtime.launch import LaunchError, launch  # noqa: E402

WORKER = os.path.join(ROOT, "scripts", "bench_data_parallel_worker.py")
FULL = {"steps": 10, "rounds": 5, "warmup": 3, "width": 2048, "depth": 3, "batch": 16}
QUICK = {"steps": 4, "rounds": 2, "warmup": 1, "width": 1024, "depth": 2, "batch": 8}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small MLP, few steps: under a minute")
    p.add_argument("--out", default=".bench", help="folder for the JSON and PNG")
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks)")
    p.add_argument("--models", default="transformer,mlp", help="comma list: transformer,mlp")
    p.add_argument("--bucket-mb", default="25,1", help="comma list of bucket sizes (MB)")
    for name in FULL:
        p.add_argument(f"--{name}", type=int, default=None, help=f"default {FULL[name]} "
                       f"({QUICK[name]} with --quick)")
    p.add_argument("--timeout", type=float, default=3600, help="stop after this many seconds")
    return p.parse_args(argv)


def worker_args(ns: argparse.Namespace) -> list[str]:
    base = QUICK if ns.quick else FULL
    args = ["--models", ns.models, "--bucket-mb", ns.bucket_mb]
    for name, default in base.items():
        value = getattr(ns, name)
        args += [f"--{name}", str(default if value is None else value)]
    return args


def table(rows: list[dict]) -> str:
    lines = [f"{'model':12} {'params':>10} {'bucket MB':>9} {'strategy':10} "
             f"{'median ms':>10} {'x DDP':>7} {'hidden':>7}"]
    for r in rows:
        hidden = "" if r["hidden_fraction"] is None else f"{100 * r['hidden_fraction']:.0f}%"
        lines.append(f"{r['model']:12} {r['params']:>10,} {r['bucket_mb']:>9g} "
                     f"{r['strategy']:10} {1000 * r['median_s']:>10.2f} "
                     f"{r['ratio_to_ddp']:>7.3f} {hidden:>7}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Ratios to DDP per model and bucket size, and one overlap timeline."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["bucket_mb"]) for r in rows}, key=str)
    labels = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, (bars, lanes) = plt.subplots(1, 2, figsize=(13, 4.2))
    width = 0.8 / len(groups)
    for g, (model, bucket) in enumerate(groups):
        ratio = {r["strategy"]: r["ratio_to_ddp"] for r in rows
                 if (r["model"], r["bucket_mb"]) == (model, bucket)}
        xs = [i + g * width for i in range(len(labels))]
        bars.bar(xs, [ratio.get(s, 0) for s in labels], width, label=f"{model}, {bucket:g} MB")
    bars.axhline(1.0, color="black", linewidth=0.8)
    bars.axhline(1.05, color="grey", linestyle="--", linewidth=0.8)
    bars.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, rotation=30)
    bars.set_ylabel("median step time / DDP's (log scale)")
    bars.set_yscale("log")
    bars.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    bars.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
    bars.legend(fontsize=8)
    shown = [r for r in rows if r["strategy"] == "overlap" and r["timeline"]]
    if shown:
        big = max(shown, key=lambda r: (r["params"], -r["bucket_mb"]))  # most buckets
        plot_timeline(big["timeline"], ax=lanes,
                      title=f"overlap, {big['model']}, {big['bucket_mb']:g} MB buckets")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ns = parse(argv)
    start = time.monotonic()
    try:
        run = launch(WORKER, nproc=ns.nproc, args=worker_args(ns), timeout_s=ns.timeout,
                     quiet=True)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = run.result
    os.makedirs(ns.out, exist_ok=True)
    json_path = os.path.join(ns.out, "bench_data_parallel.json")
    with open(json_path, "w") as f:
        json.dump({**result, "quick": ns.quick}, f, indent=1)
    png_path = os.path.join(ns.out, "bench_data_parallel.png")
    plot(result["rows"], png_path)
    print(table(result["rows"]))
    print(f"{result['world_size']} processes, {result['backend']}; wrote {json_path} and "
          f"{png_path}")
    print(f"[time] bench_data_parallel took {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
