"""Per-parameter all-reduce, flat buckets, buckets launched from gradient hooks, and torch DDP,
side by side on one model: same parameters? how fast? what overlaps? (notebook 08)

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bucket_sweep
    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bucket_sweep --sweep-mb 0.25,1,4

Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process). Every configuration trains its
own copy of the same MLP (many weight matrices of about 256 kB) from the same weights on the
same batch with SGD; the configurations take turns, a few steps each, so that a slow spell of
the machine hits them all alike. Rank 0 hands back, per configuration: the median step time,
the number of collectives per step, the timeline of the last step (from the wrappers'
recorder; for DDP from a communication hook), whether the final parameters agree with DDP's, and
whether every rank holds bitwise the same parameters.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.core.train_step import finish_sync
from course_lib.lessons.timeline import CommRecorder, torch_sync
from course_lib.runtime.launch import report_progress, save_result
from course_lib.runtime.worker import Worker, print0, worker
from course_lib.tasks.models import parameter_checksum, parameter_vector
from course_lib.train.syncs import wrap_model

WIDTH = 256  # hidden width: each hidden weight matrix is WIDTH x WIDTH floats (256 kB)
DEPTH = 12  # hidden layers
BATCH = 32  # examples per rank per step
STRATEGIES = ("naive", "ring", "allreduce", "bucketed", "overlap", "ddp")  # train/syncs.py


def make_deep_mlp(seed: int, device: torch.device) -> nn.Sequential:
    """The same weights for every configuration (and every rank) built from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(WIDTH // 4, WIDTH), nn.Tanh()]
        for _ in range(DEPTH):
            layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
        model = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    return model.to(device)


def rank_batch(w: Worker) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of a fixed global batch: x (BATCH, WIDTH / 4), y (BATCH,)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(w.world_size * BATCH, WIDTH // 4, generator=g)
    y = torch.randint(0, 10, (w.world_size * BATCH,), generator=g)
    rows = slice(w.rank * BATCH, (w.rank + 1) * BATCH)
    return x[rows].to(w.device), y[rows].to(w.device)


class DDPClock:
    """A DDP communication hook that averages each bucket and notes when its all-reduce ran,
    on the clock of a ``CommRecorder`` (seconds from the start of the step)."""

    def __init__(self, group, world_size: int, recorder: CommRecorder):
        self.group, self.world_size, self.clock = group, world_size, recorder.clock

    def hook(self, state, bucket):
        event = self.clock.add(f"bucket {bucket.index()}", "comm", self.clock.now(),
                               nbytes=bucket.buffer().numel() * bucket.buffer().element_size())
        tensor = bucket.buffer().div_(self.world_size)  # the sum of g / N is the mean

        def done(future):
            event["end_s"] = self.clock.now()
            return future.value()[0]

        return dist.all_reduce(tensor, group=self.group, async_op=True).get_future().then(done)


class Config:
    """One way of syncing gradients: its model, its optimizer and what it measured."""

    def __init__(self, label: str, strategy: str, bucket_mb: float, w: Worker):
        self.label, self.strategy, self.bucket_mb, self.w = label, strategy, bucket_mb, w
        self.model = wrap_model(strategy, make_deep_mlp(0, w.device), w.group, w.device,
                                bucket_mb, recorder=CommRecorder)  # ours: counted and timed
        self.module = self.model.module
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.05)
        self.times: list[float] = []
        self.recorder = getattr(self.model, "recorder", None)
        if self.recorder is None:  # torch DDP: a communication hook tells when buckets ran
            self.recorder = CommRecorder(dist.all_reduce)
            self.model.register_comm_hook(None, DDPClock(w.group, w.world_size,
                                                         self.recorder).hook)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        torch_sync()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        self.recorder.start_step()  # time 0 of the timeline: backward starts now
        with self.recorder.compute("backward"):
            loss.backward()  # DDP and "overlap" all-reduce buckets during backward
        finish_sync(self.model)  # ours: the rest of the sync; every .grad is the mean now
        self.optimizer.step()
        torch_sync()
        self.times.append(time.perf_counter() - start)
        self.recorder.settle()

    def buckets(self) -> int | None:
        return len(self.model.buckets) if hasattr(self.model, "buckets") else None


def replicas_equal(model: nn.Module, w: Worker) -> bool:
    """True when every rank holds bitwise the same parameters."""
    mine = parameter_checksum(model)
    every = [None] * w.world_size
    dist.all_gather_object(every, mine, group=w.group)
    return all(c == mine for c in every)


def run_configs(configs: list[Config], w: Worker, rounds: int, steps: int) -> None:
    """Warm up, then let the configurations take turns, ``steps`` timed steps each."""
    x, y = rank_batch(w)
    for config in configs:
        config.step(x, y)  # the first step builds buffers: not timed
        config.times = []
    for turn in range(rounds):
        for config in configs:
            for _ in range(steps):
                config.step(x, y)
        report_progress(turn + 1, rounds, "rounds")


def summary(config: Config, reference: torch.Tensor, w: Worker) -> dict:
    params = parameter_vector(config.module).detach().cpu()
    events = list(config.recorder.events)
    return {"label": config.label, "strategy": config.strategy, "bucket_mb": config.bucket_mb,
            "median_step_s": statistics.median(config.times), "step_times_s": config.times,
            "collectives_per_step": sum(e["kind"] == "comm" for e in events),
            "buckets": config.buckets(), "timeline": events,
            "max_difference_to_ddp": float((params - reference).abs().max()),
            "same_as_ddp": bool(torch.allclose(params, reference, rtol=1e-5, atol=1e-5)),
            "replicas_bitwise_equal": replicas_equal(config.module, w)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bucket-mb", type=float, default=1.0, help="bucket size of the comparison")
    p.add_argument("--sweep-mb", default="0.0625,0.25,4,25",
                   help="more bucket sizes for 'overlap' (besides --bucket-mb)")
    p.add_argument("--rounds", type=int, default=2, help="turns of every configuration")
    p.add_argument("--steps", type=int, default=2, help="timed steps per turn")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    with worker(seed=0) as w:
        configs = [Config(s, s, args.bucket_mb, w) for s in STRATEGIES]
        configs += [Config(f"overlap {mb:g} MB", "overlap", mb, w)
                    for mb in map(float, args.sweep_mb.split(","))]
        run_configs(configs, w, args.rounds, args.steps)
        reference = parameter_vector(configs[STRATEGIES.index("ddp")].module).detach().cpu()
        rows = [summary(c, reference, w) for c in configs]
        for row in rows:
            print0(w, f"[time] {row['label']:>18}: {1000 * row['median_step_s']:7.2f} ms/step, "
                      f"{row['collectives_per_step']} collectives")
        for c in configs:
            c.recorder.close()
        sizes = {"parameters": sum(p.numel() for p in configs[0].module.parameters()),
                 "tensors": len(list(configs[0].module.parameters()))}
        save_result({"world_size": w.world_size, "backend": w.backend, "model": sizes,
                     "bucket_mb": args.bucket_mb, "rows": rows})


if __name__ == "__main__":
    main()
