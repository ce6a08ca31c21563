"""Per-parameter all-reduce, flat buckets, buckets launched from gradient hooks, and torch DDP,
side by side on one model: same parameters? how fast? what overlaps? (notebook 08)

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bucket_sweep
    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bucket_sweep --sweep-mb 0.25,1,4
    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.bucket_sweep \\
        --link-alpha-us 500 --link-gb-per-s 0.0625 --strategies allreduce,bucketed,overlap,ddp \\
        --sweep-mb "" --compute-only --hooks workspace/my_hooks.py

Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process). Every configuration trains its
own copy of the same MLP (many weight matrices of about 256 kB) from the same weights on the
same batch with SGD; the configurations take turns, a few steps each, so that a slow spell of
the machine hits them all alike. Rank 0 hands back, per configuration: the median step time,
the number of collectives per step, the timeline of the fastest timed step (the one other work
on the machine disturbed least; from the wrappers' recorder, for DDP from a communication
hook), whether the final parameters agree with DDP's, and whether every rank holds bitwise the
same parameters.

With ``--link-alpha-us`` and ``--link-gb-per-s`` every all-reduce runs on an emulated link
whose transfers use no CPU (``course_lib.lessons.emulated_link``); the parameters are then
compared with those of torch DDP without the link. Two more rows on request: ``--hooks PATH``,
"your hooks" (``BucketHooks`` of exercise 8.3 from PATH, once it passed its checker), and
``--compute-only``, the same steps with no gradient sync at all.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.lessons.emulated_link import EmulatedLink
from course_lib.lessons.timeline import CommRecorder, torch_sync
from course_lib.runtime.launch import report_progress, save_result
from course_lib.runtime.worker import Worker, print0, worker
from course_lib.runtime.workspace import has_passed, load_file
from course_lib.tasks.models import parameter_checksum, parameter_vector
from course_lib.train.syncs import wrap_model

WIDTH = 256  # hidden width: each hidden weight matrix is WIDTH x WIDTH floats (256 kB)
DEPTH = 12  # hidden layers
BATCH = 32  # examples per rank per step (--batch)
STRATEGIES = ("naive", "ring", "allreduce", "bucketed", "overlap", "ddp")  # train/syncs.py
ON_A_LINK = ("allreduce", "bucketed", "overlap", "ddp")  # their all-reduce can be asynchronous
COMPUTE_ONLY, YOUR_HOOKS = "compute only", "your hooks"  # rows on request


def make_deep_mlp(seed: int, device: torch.device) -> nn.Sequential:
    """The same weights for every configuration (and every rank) built from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(WIDTH // 4, WIDTH), nn.Tanh()]
        for _ in range(DEPTH):
            layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
        model = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    return model.to(device)


def rank_batch(w: Worker, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of a fixed global batch: x (batch, WIDTH / 4), y (batch,)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(w.world_size * batch, WIDTH // 4, generator=g)
    y = torch.randint(0, 10, (w.world_size * batch,), generator=g)
    rows = slice(w.rank * batch, (w.rank + 1) * batch)
    return x[rows].to(w.device), y[rows].to(w.device)


class DDPClock:
    """A DDP communication hook that averages each bucket and notes when its all-reduce ran,
    on the clock of a ``CommRecorder`` (seconds from the start of the step); with ``link``,
    the all-reduce runs on that emulated link."""

    def __init__(self, group: dist.ProcessGroup, world_size: int, recorder: CommRecorder,
                 link: EmulatedLink | None = None):
        self.group, self.world_size, self.clock = group, world_size, recorder.clock
        self.link = link

    def hook(self, state, bucket):
        event = self.clock.add(f"bucket {bucket.index()}", "comm", self.clock.now(),
                               nbytes=bucket.buffer().numel() * bucket.buffer().element_size())

        def done(future):
            event["end_s"] = self.clock.now()
            value = future.value()
            return value if torch.is_tensor(value) else value[0]

        if self.link is not None:  # the mean, in a future completed at the link's finish
            return self.link.ddp_hook(state, bucket).then(done)
        tensor = bucket.buffer().div_(self.world_size)  # the sum of g / N is the mean
        return dist.all_reduce(tensor, group=self.group, async_op=True).get_future().then(done)


@contextmanager
def all_reduce_routed_to(function):
    """``dist.all_reduce`` is ``function`` inside the block: the learner's hooks call it."""
    saved = dist.all_reduce
    dist.all_reduce = function
    try:
        yield
    finally:
        dist.all_reduce = saved


class Config:
    """One way of syncing gradients: its model, its optimizer and what it measured."""

    def __init__(self, label: str, strategy: str, bucket_mb: float, w: Worker,
                 link: EmulatedLink | None = None, hooks_class=None):
        self.label, self.strategy, self.bucket_mb, self.w = label, strategy, bucket_mb, w
        self.link, self.routing = link, nullcontext
        self.model, self.recorder, self.finish = self._wrap(make_deep_mlp(0, w.device),
                                                            hooks_class)
        self.module = getattr(self.model, "module", self.model)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.05)
        self.times: list[float] = []  # each timed step, seconds
        self.backward: list[float] = []  # the backward of each timed step, seconds
        self.timeline: list[dict] = []  # the events of the fastest timed step

    def _wrap(self, module: nn.Module, hooks_class):
        """The model, its recorder (counts and times every all-reduce) and what finishes the
        gradient sync after backward."""
        link, w, cap = self.link, self.w, self.bucket_mb
        if self.strategy in STRATEGIES and self.strategy != "ddp":  # ours
            model = wrap_model(self.strategy, module, w.group, w.device, cap, recorder=lambda
                               inner: CommRecorder(inner if link is None else link.all_reduce))
            return model, model.recorder, model.finish_gradient_sync
        recorder = CommRecorder(dist.all_reduce if link is None else link.all_reduce)
        if self.strategy == "ddp":  # its buckets are inside: a communication hook times them
            model = wrap_model("ddp", module, w.group, w.device, cap)
            model.register_comm_hook(None, DDPClock(w.group, w.world_size, recorder, link).hook)
            return model, recorder, lambda: None  # DDP synced inside backward
        if self.strategy == YOUR_HOOKS:  # they call dist.all_reduce: route it to the recorder
            self.routing = lambda: all_reduce_routed_to(recorder)
            return module, recorder, hooks_class(module, w.group, bucket_cap_mb=cap).finish
        return module, recorder, lambda: None  # compute only: no sync at all

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        torch_sync()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        with self.routing():
            loss = F.cross_entropy(self.model(x), y)
            self.recorder.start_step()  # time 0 of the timeline: backward starts now
            with self.recorder.compute("backward") as backward:
                loss.backward()  # DDP and "overlap" all-reduce buckets during backward
            self.finish()  # every .grad is the mean now (DDP did it in backward)
        self.optimizer.step()
        torch_sync()
        self.times.append(time.perf_counter() - start)
        self.backward.append(backward["end_s"] - backward["start_s"])
        self.recorder.settle()
        if self.times[-1] == min(self.times):  # load only adds time: keep the steadiest step
            self.timeline = [dict(event) for event in self.recorder.events]

    def buckets(self) -> int | None:
        return len(self.model.buckets) if hasattr(self.model, "buckets") else None

    def close(self) -> None:
        self.recorder.close()
        if self.link is not None:
            self.link.close()


def replicas_equal(model: nn.Module, w: Worker) -> bool:
    """True when every rank holds bitwise the same parameters."""
    mine = parameter_checksum(model)
    every = [None] * w.world_size
    dist.all_gather_object(every, mine, group=w.group)
    return all(c == mine for c in every)


def run_configs(configs: list[Config], w: Worker, rounds: int, steps: int,
                batch: int) -> None:
    """Warm up, then let the configurations take turns, ``steps`` timed steps each."""
    x, y = rank_batch(w, batch)
    for config in configs:
        config.step(x, y)  # the first step builds buffers: not timed
        config.times, config.backward = [], []
    for turn in range(rounds):
        for config in configs:
            for _ in range(steps):
                config.step(x, y)
        report_progress(turn + 1, rounds, "rounds")


def summary(config: Config, reference: torch.Tensor, w: Worker) -> dict:
    params = parameter_vector(config.module).detach().cpu()
    events = config.timeline
    comm_bytes = [e["bytes"] for e in events if e["kind"] == "comm"]
    link = config.link  # its alpha + beta n, summed over the step's messages: the link alone
    link_s = None if link is None else sum(link.message_s(n) for n in comm_bytes)
    return {"label": config.label, "strategy": config.strategy, "bucket_mb": config.bucket_mb,
            "median_step_s": statistics.median(config.times), "step_times_s": config.times,
            "backward_times_s": config.backward,
            "collectives_per_step": len(comm_bytes),
            "buckets": config.buckets(), "timeline": events, "link_s": link_s,
            "max_difference_to_ddp": float((params - reference).abs().max()),
            "same_as_ddp": bool(torch.allclose(params, reference, rtol=1e-5, atol=1e-5)),
            "replicas_bitwise_equal": replicas_equal(config.module, w)}


def learner_hooks(path: str | None, w: Worker):
    """``BucketHooks`` from ``path`` once it passed exercise 8.3, else None (rank 0 says why)."""
    if path is None:
        return None
    if not Path(path).is_file():
        print0(w, f"your hooks: there is no {path}; exercise 8.3's %%writefile cell writes it "
                  "(this run goes on without it)")
        return None
    if not has_passed("8.3", path):
        print0(w, f"your hooks: {path} has not passed exercise 8.3 as it is now; run "
                  "check.nb08.my_hooks on it first (this run goes on without it)")
        return None
    return load_file(Path(path), "my_hooks").BucketHooks


def make_link(args: argparse.Namespace, w: Worker) -> EmulatedLink | None:
    """A new emulated link (one per configuration, idle when its turn comes), or None."""
    if args.link_alpha_us is None:
        return None
    return EmulatedLink(args.link_alpha_us * 1e-6, args.link_gb_per_s * 1e9, w.group)


def make_configs(args: argparse.Namespace, w: Worker) -> list[Config]:
    """The configurations to time, in turn order."""
    configs = [Config(s, s, args.bucket_mb, w, make_link(args, w)) for s in args.strategies]
    configs += [Config(f"overlap {mb:g} MB", "overlap", mb, w, make_link(args, w))
                for mb in args.sweep_mb]
    hooks_class = learner_hooks(args.hooks, w)
    if hooks_class is not None:
        configs.append(Config(YOUR_HOOKS, YOUR_HOOKS, args.bucket_mb, w, make_link(args, w),
                              hooks_class))
    if args.compute_only:
        configs.append(Config(COMPUTE_ONLY, COMPUTE_ONLY, args.bucket_mb, w))
    return configs


def numbers(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bucket-mb", type=float, default=1.0, help="bucket size of the comparison")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"which of {', '.join(STRATEGIES)} to run (comma-separated)")
    p.add_argument("--sweep-mb", type=numbers, default="0.0625,0.25,4,25",
                   help="more bucket sizes for 'overlap' (besides --bucket-mb); '' for none")
    p.add_argument("--rounds", type=int, default=2, help="turns of every configuration")
    p.add_argument("--steps", type=int, default=2, help="timed steps per turn")
    p.add_argument("--batch", type=int, default=BATCH, help="examples per rank per step")
    p.add_argument("--link-alpha-us", type=float, help="emulated link: alpha, microseconds")
    p.add_argument("--link-gb-per-s", type=float, help="emulated link: bandwidth, GB/s")
    p.add_argument("--hooks", help="also run BucketHooks from this file (exercise 8.3)")
    p.add_argument("--compute-only", action="store_true",
                   help="also time the steps without any gradient sync")
    args = p.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in STRATEGIES]
    if unknown:
        p.error(f"unknown strategies {unknown}; pick from {', '.join(STRATEGIES)}")
    if (args.link_alpha_us is None) != (args.link_gb_per_s is None):
        p.error("an emulated link needs both --link-alpha-us and --link-gb-per-s")
    if args.link_alpha_us is not None:
        synchronous = [s for s in args.strategies if s not in ON_A_LINK]
        if synchronous:
            p.error(f"{synchronous} cannot run on the link: it needs an all-reduce that "
                    f"returns at once (async_op=True); pick from {', '.join(ON_A_LINK)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with worker(seed=0) as w:
        configs = make_configs(args, w)
        ddp = [c for c in configs if c.strategy == "ddp" and c.link is None]
        reference = ddp[0] if ddp else Config("reference", "ddp", args.bucket_mb, w)
        untimed = [] if ddp else [reference]  # DDP on the real all-reduce, not reported
        run_configs(configs + untimed, w, args.rounds, args.steps, args.batch)
        expected = parameter_vector(reference.module).detach().cpu()
        rows = [summary(c, expected, w) for c in configs]
        for row in rows:
            print0(w, f"[time] {row['label']:>18}: {1000 * row['median_step_s']:7.2f} ms/step, "
                      f"{row['collectives_per_step']} collectives")
        for c in configs + untimed:
            c.close()
        sizes = {"parameters": sum(p.numel() for p in configs[0].module.parameters()),
                 "tensors": len(list(configs[0].module.parameters()))}
        link = None if args.link_alpha_us is None else {
            "alpha_s": args.link_alpha_us * 1e-6, "bytes_per_s": args.link_gb_per_s * 1e9}
        save_result({"world_size": w.world_size, "backend": w.backend, "model": sizes,
                     "bucket_mb": args.bucket_mb, "batch": args.batch, "link": link,
                     "rows": rows})


if __name__ == "__main__":
    main()
