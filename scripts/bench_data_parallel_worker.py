"""Step time of every gradient-sync strategy against torch DDP (notebook 08; run by
``scripts/bench_data_parallel.py``, which writes the table, JSON and picture).

    python -m course_lib.runtime.launch --nproc 2 scripts/bench_data_parallel_worker.py \\
        --models transformer,mlp --bucket-mb 25,1 --steps 10 --rounds 3

Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process). Every configuration trains its
own copy of the same model on the same data; the configurations take turns, ``--steps`` timed
steps at a time, for ``--rounds`` rounds, so that a slow spell of the machine hits them all
alike. A step is: zero the gradients, forward, backward, sync, SGD update. Rank 0 hands back
every step time and, for our strategies, how much communication backward hid.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.train_step import finish_sync
from course_lib.lessons.timeline import CommRecorder, overlap_summary
from course_lib.runtime.launch import report_progress, save_result
from course_lib.runtime.worker import print0, worker
from course_lib.tasks.models import count_parameters, make_transformer
from course_lib.tasks.sequences import IGNORE, global_batch
from course_lib.train.syncs import SYNCS, wrap_model

LABELS = (*SYNCS, "ddp views", "no sync")  # every configuration, DDP first


def wide_mlp(width: int, depth: int, seed: int, device) -> nn.Module:
    """A wide MLP whose gradients are many megabytes: communication matters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(width // 4, width), nn.GELU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        layers.append(nn.Linear(width, 10))
        model = nn.Sequential(*layers)
    return model.to(device)


def workload(name: str, w, args):
    """(make_model, loss_of(model)) for one model; the data is this rank's shard."""
    if name == "transformer":
        batch = global_batch(seed=0, step=0, size=w.world_size * args.batch).to(w.device)
        mine = batch[w.rank * args.batch:(w.rank + 1) * args.batch]

        def loss_of(model):
            logits = model(mine.inputs)  # (batch, length, vocab)
            total = F.cross_entropy(logits.flatten(0, 1), mine.targets.flatten(),
                                    ignore_index=IGNORE, reduction="sum")
            return total * w.world_size / batch.num_targets  # mean over the global batch

        return (lambda: make_transformer(seed=0, device=w.device)), loss_of
    if name == "mlp":
        g = torch.Generator().manual_seed(w.rank)
        x = torch.randn(args.batch, args.width // 4, generator=g).to(w.device)  # (B, width/4)
        y = torch.randint(0, 10, (args.batch,), generator=g).to(w.device)
        return (lambda: wide_mlp(args.width, args.depth, 0, w.device)), (
            lambda model: F.cross_entropy(model(x), y))
    raise ValueError(f"unknown model {name!r}; use transformer or mlp")


class Runner:
    """One configuration: a model, how it syncs, an optimizer, and its measured steps."""

    def __init__(self, label: str, make, loss_of, w, bucket_mb: float):
        self.label, self.loss_of, self.times, self.hidden = label, loss_of, [], []
        module = make()
        if label == "ddp views":
            ids = [w.device.index] if w.device.type == "cuda" else None
            self.model = DDP(module, device_ids=ids, bucket_cap_mb=bucket_mb,
                             gradient_as_bucket_view=True)
        elif label == "no sync":
            self.model = module  # a lower bound: no communication at all
        else:
            self.model = wrap_model(label, module, w.group, w.device, bucket_mb,
                                    recorder=CommRecorder)  # times each call, for the timeline
        self.recorder = getattr(self.model, "recorder", None)
        self.opt = torch.optim.SGD(module.parameters(), lr=1e-4)
        self.device = w.device

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_of(self.model)
        if self.recorder is not None:
            self.recorder.start_step()
            with self.recorder.compute("backward"):
                loss.backward()
        else:
            loss.backward()  # DDP syncs inside backward
        if self.label != "no sync":
            finish_sync(self.model)
        self.opt.step()

    def timed(self, steps: int) -> None:
        for _ in range(steps):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            self.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - start)
            if self.label == "overlap":
                self.recorder.settle()
                self.hidden.append(overlap_summary(self.recorder.events)["hidden_fraction"])


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def bench_one(w, args, name: str, bucket_mb: float, done: list) -> list[dict]:
    make, loss_of = workload(name, w, args)
    params = count_parameters(make())
    runners = [Runner(label, make, loss_of, w, bucket_mb) for label in LABELS]
    for runner in runners:
        runner.timed(args.warmup)  # first steps build buffers and warm caches
        runner.times, runner.hidden = [], []
    for _ in range(args.rounds):
        for runner in runners:
            runner.timed(args.steps)
            done[0] += 1
            report_progress(done[0], done[1], "configurations")
    ddp_median = median(runners[0].times)
    rows = []
    for r in runners:
        rows.append({"model": name, "params": params, "bucket_mb": bucket_mb,
                     "strategy": r.label, "median_s": median(r.times),
                     "ratio_to_ddp": median(r.times) / ddp_median, "steps": len(r.times),
                     "times_s": [round(t, 6) for t in r.times],
                     "hidden_fraction": median(r.hidden) if r.hidden else None,
                     "timeline": list(r.recorder.events) if r.recorder else None})
        row = rows[-1]
        print0(w, f"[time] {name} bucket {bucket_mb:g} MB {r.label}: "
                  f"{1000 * row['median_s']:.2f} ms/step ({row['ratio_to_ddp']:.3f} x DDP)")
    for r in runners:
        if r.recorder is not None:
            r.recorder.close()
    return rows


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="transformer,mlp", help="comma list: transformer,mlp")
    p.add_argument("--bucket-mb", default="25,1", help="comma list of bucket sizes in MB")
    p.add_argument("--steps", type=int, default=10, help="timed steps per turn")
    p.add_argument("--rounds", type=int, default=3, help="turns of every configuration")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch", type=int, default=16, help="examples per rank per step")
    p.add_argument("--width", type=int, default=2048, help="MLP width (parameters ~ width^2)")
    p.add_argument("--depth", type=int, default=3, help="hidden width x width layers")
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    models, buckets = args.models.split(","), [float(b) for b in args.bucket_mb.split(",")]
    with worker(seed=0) as w:
        done = [0, len(models) * len(buckets) * args.rounds * len(LABELS)]
        rows = []
        for name in models:
            for bucket_mb in buckets:
                rows += bench_one(w, args, name, bucket_mb, done)
        save_result({"world_size": w.world_size, "backend": w.backend, "args": vars(args),
                     "rows": rows})


if __name__ == "__main__":
    main()
