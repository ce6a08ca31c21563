"""How fast, and how big, is course_lib's fully_shard next to torch's, on 2 and 4 processes?

    python scripts/bench_fully_shard.py                  # a few minutes on a busy laptop
    python scripts/bench_fully_shard.py --quick          # about a minute
    python scripts/bench_fully_shard.py --nproc 2,4 --width 1024 --depth 8 --steps 20

Trains the same residual MLP (``--depth`` blocks of ``--width`` x ``--width``, each block
wrapped, then the root) with AdamW under three implementations of ZeRO-3: ``torch``
(``torch.distributed.fsdp.fully_shard``, FSDP2), ``ours`` (``course_lib.core.fully_shard``) and
``ours+prefetch`` (``course_lib.core.prefetch``). One launch per process count holds the three
models; they take turns step by step, so that a slow spell of the machine hits them alike. A
step's time is the slowest rank's; the table gives the median and the spread (the 10th to the
90th percentile) over ``--steps`` steps after ``--warmup``, and the ratio to torch's median.

Peak memory: the most tensor bytes alive at once during one more step of each model: what the
model and optimizer hold before it (parameters, gradients, optimizer state: storage bytes) plus
the most that the step's allocations, less its frees, came to, in the order torch's profiler
saw them (``profile_memory=True``; allocations made inside Gloo's own threads, such as its
all-gather's staging buffer, escape it, for both implementations alike). On a GPU,
``torch.cuda.max_memory_allocated`` over that step. The largest over the ranks.

The script launches itself: with ``--worker`` it is one rank of the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

IMPLEMENTATIONS = ("torch", "ours", "ours+prefetch")
FULL = {"width": 1024, "depth": 8, "batch": 32, "steps": 20, "warmup": 3}
QUICK = {"width": 512, "depth": 6, "batch": 16, "steps": 8, "warmup": 2}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller model, fewer steps")
    p.add_argument("--nproc", default="2,4", help="comma list of process counts")
    for name in FULL:
        p.add_argument(f"--{name}", type=int, default=None,
                       help=f"default {FULL[name]} ({QUICK[name]} with --quick)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    for name, value in (QUICK if ns.quick else FULL).items():
        setattr(ns, name, value if getattr(ns, name) is None else getattr(ns, name))
    return ns


def wrapper(name: str):
    if name == "torch":
        from torch.distributed.fsdp import fully_shard
    elif name == "ours":
        from course_lib.core.fully_shard import fully_shard
    else:
        from course_lib.core.prefetch import fully_shard
    return fully_shard


def run_rank(ns: argparse.Namespace) -> None:
    """One rank: build and wrap the three models, train them in turn, measure one step each."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from course_lib.runtime.launch import save_result
    from course_lib.runtime.worker import worker

    class Block(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.linear = nn.Linear(width, width)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + torch.tanh(self.linear(h))  # (batch, width)

    with worker(seed=0) as w:
        x = torch.randn(ns.batch, ns.width, device=w.device)
        models, optimizers = {}, {}
        for name in IMPLEMENTATIONS:
            torch.manual_seed(0)
            model = nn.Sequential(*[Block(ns.width) for _ in range(ns.depth)]).to(w.device)
            for module in [*model, model]:
                wrapper(name)(module)
            models[name] = model
            optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(name: str) -> float:
            start = time.perf_counter()
            models[name](x).square().mean().backward()
            getattr(models[name], "finish_gradient_sync", lambda: None)()
            optimizers[name].step()
            optimizers[name].zero_grad()
            if w.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - start

        times = {name: [] for name in IMPLEMENTATIONS}
        for _ in range(ns.warmup + ns.steps):
            for name in IMPLEMENTATIONS:  # in turn: a slow spell hits all three
                times[name].append(step(name))
        result = {"params": sum(p.numel() for p in models["torch"].parameters())}  # global
        for name in IMPLEMENTATIONS:
            slowest = torch.tensor(times[name][ns.warmup:], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step ends when all are done
            peak = torch.tensor([float(peak_bytes(lambda n=name: step(n), models[name],
                                                  optimizers[name], w.device))],
                                dtype=torch.float64)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            result[name] = {"times": slowest.tolist(), "peak_bytes": peak.item()}
        save_result(result)


def peak_bytes(step, model, optimizer, device) -> int:
    """The most tensor bytes alive at once while ``step()`` runs on ``device``."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        return torch.cuda.max_memory_allocated(device)
    from torch.profiler import ProfilerActivity, profile

    held = held_bytes(model, optimizer)  # what the model and optimizer hold between steps
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()  # the profiler sees every allocation and free, in order
    changes = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]")
    alive = most = 0
    for _, change in changes:
        alive += change  # + allocated, - freed
        most = max(most, alive)
    return held + most


def held_bytes(model, optimizer) -> int:
    """Storage bytes of the parameters (this rank's shards), their gradients, the optimizer's
    state, and any gathered parameters still alive: each storage once."""
    import torch

    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    tensors = [*local, *(p.grad for p in local if p.grad is not None),
               *(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)),
               *(m.shard_state.full for m in model.modules() if hasattr(m, "shard_state"))]
    storages = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def spread(times: list[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentiles."""
    deciles = statistics.quantiles(times, n=10)
    return statistics.median(times), deciles[0], deciles[-1]


def main(argv=None) -> int:
    ns = parse(argv)
    if ns.worker:
        run_rank(ns)
        return 0
    from course_lib.runtime.launch import LaunchError, launch

    args = [f"--{name}={getattr(ns, name)}" for name in FULL] + ["--worker"]
    print(f"{'ranks':>5} {'implementation':14} {'median ms':>10} {'p10-p90 ms':>15} "
          f"{'x torch':>8} {'peak MB':>8} {'x torch':>8}", flush=True)
    for nproc in (int(n) for n in ns.nproc.split(",")):
        try:
            found = launch(__file__, nproc=nproc, args=args, timeout_s=3600, quiet=True).result
        except LaunchError as e:
            print(f"error: {nproc} processes: {e}", file=sys.stderr)
            return 1
        base, base_peak = spread(found["torch"]["times"])[0], found["torch"]["peak_bytes"]
        for name in IMPLEMENTATIONS:
            median, low, high = spread(found[name]["times"])
            peak = found[name]["peak_bytes"]
            print(f"{nproc:>5} {name:14} {1000 * median:>10.1f} "
                  f"{f'{1000 * low:.1f}-{1000 * high:.1f}':>15} {median / base:>8.2f} "
                  f"{peak / 2**20:>8.1f} {peak / base_peak:>8.2f}", flush=True)
    print(f"model: {ns.depth} blocks of {ns.width} x {ns.width} ({found['params']:,} "
          f"parameters), batch {ns.batch}, AdamW; {ns.steps} timed steps after {ns.warmup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
