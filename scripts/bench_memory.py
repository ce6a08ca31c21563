"""Peak activation memory and step time against micro-batch size and accumulation steps.

    python scripts/bench_memory.py                # CPU: saved-tensor accounting
    python scripts/bench_memory.py --device cuda  # GPU: torch.cuda.max_memory_allocated
    python scripts/bench_memory.py --quick        # fewer repeats (CI-sized)

For a fixed global batch G (default 256 sequences of the sums task, tiny transformer), each row
runs one optimizer step as k micro-batches of b = G / k and measures:
- the peak activation bytes alive at once during the whole step (``SavedTensorPeak`` on CPU:
  every tensor autograd saves, each storage once, parameters excluded; on CUDA the allocator's
  peak above the step's start, which also counts temporaries);
- the median step time over repeats.
It then checks the two claims of notebook 03 and prints them as ratios:
- k micro-batches of b peak within 10% of ONE batch of b (each backward frees its graph);
- and about k times below one batch of k*b (= G).
Writes a table on stdout, JSON and a PNG into --out (default .bench/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from course_lib.core.accumulation import scale_by_global_tokens, sum_token_loss  # noqa: E402
from course_lib.lessons.memory_peak import SavedTensorPeak, cuda_step_peak  # noqa: E402
from course_lib.tasks.models import TransformerConfig, make_transformer  # noqa: E402
from course_lib.tasks.sequences import global_batch  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=256, help="sequences per optimizer step")
    p.add_argument("--accum", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                   help="accumulation steps to try (each must divide the global batch)")
    p.add_argument("--d-model", type=int, default=128, help="width of the transformer")
    p.add_argument("--repeats", type=int, default=7, help="timed steps per row")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--quick", action="store_true", help="3 repeats")
    p.add_argument("--out", default=".bench", help="folder for bench_memory.json and .png")
    args = p.parse_args(argv)
    bad = [k for k in args.accum if args.global_batch % k]
    if bad:
        p.error(f"--accum {bad} do not divide --global-batch {args.global_batch}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda needs a GPU; run without it on the CPU")
    return args


def one_step(model, micro_batches, total_tokens) -> None:
    """One accumulated step: backward on each micro-batch, the graph freed each time.

    Gradients are zeroed in place, not freed: their buffers are part of the model's fixed
    memory (counted apart), so the peak measured above the step's start is activations."""
    model.zero_grad(set_to_none=False)
    for mb in micro_batches:
        loss = sum_token_loss(model(mb.inputs), mb.targets)
        scale_by_global_tokens(loss, total_tokens).backward()  # mean over the global batch


def measure(model, batch, accum: int, repeats: int, device: torch.device) -> dict:
    b = len(batch) // accum
    micro = [batch[i * b:(i + 1) * b] for i in range(accum)]
    micro = [type(mb)(mb.inputs.clone(), mb.targets.clone()) for mb in micro]  # own storages
    total = batch.num_targets
    one_step(model, micro, total)  # warm-up (allocators, kernels)
    if device.type == "cuda":
        peak = cuda_step_peak(lambda: one_step(model, micro, total), device)
    else:
        with SavedTensorPeak(exclude=model.parameters()) as tracker:
            one_step(model, micro, total)
        peak = tracker.peak_bytes
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        one_step(model, micro, total)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return {"accum_steps": accum, "micro_batch": b, "peak_bytes": peak,
            "step_time_s": statistics.median(times)}


def single_batch_peak(model, batch, size: int, device) -> int:
    """Peak of ONE batch of ``size`` (no accumulation): the reference for the 10% claim."""
    return measure(model, batch[0:size], 1, 1, device)["peak_bytes"]


def report(rows: list[dict], refs: dict[int, int]) -> list[str]:
    lines = [f"{'accum':>5} {'micro':>5} {'peak MB':>9} {'vs 1 batch of b':>16} "
             f"{'G peak / peak':>14} {'step ms':>8}"]
    full = rows[0]["peak_bytes"] if rows[0]["accum_steps"] == 1 else None
    for r in rows:
        vs_b = r["peak_bytes"] / refs[r["micro_batch"]]
        below = full / r["peak_bytes"] if full else float("nan")
        r.update(ratio_to_one_batch_of_b=vs_b, times_below_global=below)
        lines.append(f"{r['accum_steps']:>5} {r['micro_batch']:>5} "
                     f"{r['peak_bytes'] / 2**20:>9.3f} {vs_b:>16.3f} {below:>14.2f} "
                     f"{r['step_time_s'] * 1e3:>8.1f}")
    return lines


def plot(rows: list[dict], path: str, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["accum_steps"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(ks, [r["peak_bytes"] / 2**20 for r in rows], "o-")
    a.set(xscale="log", xlabel="accumulation steps k (micro-batch = G / k)",
          ylabel="peak activation MB", title=f"memory ({device})")
    b.plot(ks, [r["step_time_s"] * 1e3 for r in rows], "o-", color="C1")
    b.set(xscale="log", xlabel="accumulation steps k", ylabel="step time (ms)", title="time")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    config = TransformerConfig(d_model=args.d_model)
    model = make_transformer(config, seed=0, device=device)
    batch = global_batch(seed=0, step=0, size=args.global_batch).to(device)
    repeats = 3 if args.quick else args.repeats
    rows = [measure(model, batch, k, repeats, device) for k in sorted(args.accum)]
    refs = {r["micro_batch"]: single_batch_peak(model, batch, r["micro_batch"], device)
            for r in rows}
    lines = report(rows, refs)
    print(f"global batch {args.global_batch}, d_model {args.d_model}, device {device}")
    print("\n".join(lines))
    worst = max(abs(r["ratio_to_one_batch_of_b"] - 1) for r in rows)
    print(f"k micro-batches of b vs one batch of b: worst difference {worst:.1%} (target <= 10%)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_memory.json"), "w") as f:
        json.dump({"device": str(device), "global_batch": args.global_batch,
                   "d_model": args.d_model, "rows": rows}, f, indent=1)
    plot(rows, os.path.join(args.out, "bench_memory.png"), str(device))
    print(f"wrote {args.out}/bench_memory.json and {args.out}/bench_memory.png")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
