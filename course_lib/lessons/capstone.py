"""What one process of the course's trainer holds and how long it computes (notebook 11).

    from course_lib.lessons.capstone import memory_per_process, trainer_model
    memory_per_process(8)   # bytes: parameters, gradients, optimizer state, activations, total
    gradient_bytes()        # bytes of each parameter's gradient, in registration order
    shard_units()           # bytes of each module fully_shard wraps: the root's own, each block's
    measure_compute()       # this machine's forward, backward and AdamW step, in ms

Memory is measured as in notebook 02, on the CPU, so every machine gets the same numbers: the
parameters, their gradients and AdamW's state after one real step, plus the activations that
autograd saves for one micro-batch (``course_lib.lessons.memory``, saved-tensor hooks). Only one
micro-batch's activations are alive at a time: each backward frees its graph (notebook 03).
The capstone's budget (``course_lib.lessons.budget``) adds what each way of syncing keeps.

Compute is timed like notebook 03's accumulation cost: the fastest of a few repeats of the
trainer's forward, backward and AdamW step on this CPU, for several micro-batch sizes, with a
straight line (a fixed cost plus a cost per example) fitted through them.

``play(...)`` plays one optimizer step out on one process, compute beside one link that carries
the collectives of a way of syncing (DDP's buckets, Zero1, Zero2, fully_shard) at alpha-beta
prices: the time model of the budget, which calls it.
"""

from __future__ import annotations

import functools
import numbers
import time
from dataclasses import dataclass, field

import torch

from course_lib.core.accumulation import sum_token_loss
from course_lib.lessons.cost_model import AlphaBeta, latencies_and_bytes, predict_all_reduce_s
from course_lib.lessons.memory import fit_line, memory_breakdown
from course_lib.tasks.models import make_transformer
from course_lib.tasks.sequences import global_batch
from course_lib.train.config import TrainConfig

KIB = 1024  # bytes in a KiB
PARTS = ("parameters", "gradients", "optimizer state", "activations")
LR = 3e-3  # the trainer's peak learning rate (AdamW's state does not depend on it)


def trainer_model(config: TrainConfig | None = None) -> torch.nn.Module:
    """The model ``course_lib.train`` builds, on the CPU in float32."""
    c = config or TrainConfig()
    return make_transformer(c.model_shape, seed=c.seed)


@functools.lru_cache(maxsize=64)
def _measure(micro_batch: int, lr: float, seed: int) -> tuple[int, ...]:
    model = trainer_model(TrainConfig(seed=seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)  # the trainer's optimizer
    batch = global_batch(seed, 0, micro_batch, TrainConfig().max_digits)
    parts = memory_breakdown(model, optimizer, batch.inputs, batch.targets,
                             loss_fn=sum_token_loss)  # one real step, then a fresh forward
    return tuple(parts[name] for name in PARTS)


def memory_per_process(micro_batch: int, seed: int = 0) -> dict[str, int]:
    """Bytes one process holds for a micro-batch of this size; "total" adds them up."""
    if (isinstance(micro_batch, bool) or not isinstance(micro_batch, numbers.Integral)
            or micro_batch < 1):  # an int, or numpy's
        raise ValueError(f"micro_batch must be a whole number >= 1, got {micro_batch!r}")
    parts = dict(zip(PARTS, _measure(int(micro_batch), LR, seed), strict=True))
    parts["total"] = sum(parts.values())
    return parts


@functools.cache
def gradient_bytes() -> tuple[int, ...]:
    """Bytes of each parameter's gradient (float32: 4 a number), in registration order."""
    return tuple(p.numel() * p.element_size() for p in trainer_model().parameters())


@functools.cache
def shard_units() -> tuple[tuple[str, int], ...]:
    """(name, bytes of its parameters) of each module ``fully_shard`` wraps (notebook 10), in
    forward order: the root's own (embeddings, final norm, head), then each block."""
    model = trainer_model()
    blocks = [(f"block {i}", sum(p.numel() * p.element_size() for p in block.parameters()))
              for i, block in enumerate(model.blocks)]
    return (("root", sum(gradient_bytes()) - sum(b for _, b in blocks)), *blocks)


def _pass_ms(model: torch.nn.Module, batch) -> tuple[float, float]:
    """One forward and one backward, in ms."""
    start = time.perf_counter()
    loss = sum_token_loss(model(batch.inputs), batch.targets)
    middle = time.perf_counter()
    loss.backward()  # the gradients add up in .grad: harmless, nothing steps here
    return 1e3 * (middle - start), 1e3 * (time.perf_counter() - middle)


def measure_compute(sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32), repeats: int = 20,
                    seed: int = 0) -> dict[str, float]:
    """The trainer's compute on this machine, in ms: forward and backward of a micro-batch of
    b examples, each ``fixed + per_example x b`` (a line through the fastest of ``repeats``
    passes per size; the sizes take turns, so that a busy moment hits them all), and one AdamW
    step. The keys are ``budget.Machine``'s."""
    model = trainer_model(TrainConfig(seed=seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    batches = [global_batch(seed, 0, b, TrainConfig().max_digits) for b in sizes]
    fastest = [[float("inf")] * 2 for _ in sizes]  # per size: forward, backward
    step = float("inf")
    for _ in range(repeats):
        for best, batch in zip(fastest, batches, strict=True):
            best[:] = map(min, best, _pass_ms(model, batch))
        start = time.perf_counter()
        optimizer.step()  # on the gradients the passes left
        step = min(step, 1e3 * (time.perf_counter() - start))
    (f_slope, f_fixed, _), (b_slope, b_fixed, _) = (
        fit_line(list(sizes), [best[i] for best in fastest]) for i in (0, 1))
    return {"forward_ms": f_fixed, "forward_ms_per_example": f_slope,
            "backward_ms": b_fixed, "backward_ms_per_example": b_slope,
            "optimizer_ms": step}


# ---- one optimizer step, played out on one process (the budget's time model) -------------


@dataclass
class Step:
    """Compute runs one thing after the other; beside it, one link carries one collective at
    a time, in the order they were launched (a link with hardware of its own, notebook 08,
    section 9). A collective costs what the alpha-beta model says; times in ms."""

    link: AlphaBeta
    nproc: int
    t: float = 0.0  # where compute is
    link_free: float = 0.0  # when the link is done with what it was given
    compute_ms: float = 0.0
    link_ms: float = 0.0  # how long the link was busy
    sent_bytes: float = 0.0  # what this process sent: 2(N-1)/N of an all-reduce's bytes
    backward_starts: list[float] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # timeline_plot's events, in ms here
    held: list[tuple[float, float, int]] = field(default_factory=list)  # (from, to, bytes)

    def compute(self, name: str, ms: float) -> None:
        last = next((e for e in reversed(self.events) if e["kind"] == "compute"), None)
        if last and last["name"] == name and last["end"] == self.t:
            last["end"] += ms  # one bar for one pass, however it is cut
        else:
            self.events.append({"name": name, "kind": "compute", "start": self.t,
                                "end": self.t + ms})
        self.t += ms
        self.compute_ms += ms

    def launch(self, collective: str, name: str, nbytes: float) -> float:
        """Queue a collective on the link now; returns when it ends."""
        share = 1 if collective == "all-reduce" else 0.5  # the other two: half the ring
        ms = share * 1e3 * predict_all_reduce_s(self.link, "ring", nbytes, self.nproc)
        self.sent_bytes += share * latencies_and_bytes("ring", nbytes, self.nproc)[1]
        start = max(self.t, self.link_free)
        self.link_free, self.link_ms = start + ms, self.link_ms + ms
        self.events.append({"name": f"{collective} {name}", "kind": "comm", "start": start,
                            "end": start + ms, "bytes": nbytes})
        return start + ms

    def wait(self, until: float | None = None) -> None:
        """Compute waits for one collective, or (None) for everything on the link."""
        self.t = max(self.t, self.link_free if until is None else until)

    def run(self, collective: str, name: str, nbytes: float) -> None:
        self.wait(self.launch(collective, name, nbytes))  # blocking: launch, then wait

    @property
    def end_ms(self) -> float:
        return max(self.t, self.link_free)

    @property
    def peak_held_bytes(self) -> int:
        """The most bytes of ``held`` alive at one moment."""
        changes = sorted([(s, b) for s, _, b in self.held] + [(e, -b) for _, e, b in self.held])
        alive = peak = 0
        for _, change in changes:  # at one moment, a buffer freed before one is taken
            alive += change
            peak = max(peak, alive)
        return peak

    def events_from(self, whole_step: bool) -> list[dict]:
        """In seconds: every event from the step's start, or (``whole_step=False``) the last
        backward and every collective after its start, from that start."""
        zero = 0.0 if whole_step else self.backward_starts[-1]
        kept = [e for e in self.events if whole_step or e["end"] > zero
                and (e["kind"] == "comm" or e["name"] == "backward")]
        return [{**{k: v for k, v in e.items() if k not in ("start", "end")},
                 "start_s": (e["start"] - zero) / 1e3, "end_s": (e["end"] - zero) / 1e3}
                for e in kept]


def _backward_by_bucket(step: Step, backward_ms: float, buckets: tuple[int, ...],
                        collective: str, hold: bool) -> None:
    """Backward makes the gradients last layer first, at an even pace in bytes; each bucket's
    collective is launched when its last gradient is made (a gradient hook)."""
    for i, size in enumerate(buckets):
        start = step.t
        step.compute("backward", backward_ms * size / sum(buckets))
        end = step.launch(collective, f"bucket {i}", size)
        if hold:
            step.held.append((start, end, size))  # its buffer: first gradient to the end


def _zero3_micro_step(step: Step, compute: dict[str, float]) -> None:
    """fully_shard with prefetching (notebook 10): a module computes once its parameters are
    gathered; the next module's gather is launched as it starts; a module's gradient is
    reduce-scattered once complete (the root's last: its embeddings' backward ends it)."""
    units = dict(shard_units())
    order = list(units)  # forward: the root's pre-hook first, then the blocks
    for phase, names in (("forward", order), ("backward", [order[0], *order[:0:-1]])):
        if phase == "backward":
            step.backward_starts.append(step.t)
        ready = step.launch("all-gather", f"{names[0]} ({phase})", units[names[0]])
        for i, name in enumerate(names):
            step.wait(ready)
            if i + 1 < len(names):  # prefetch: the next module's gather, while this computes
                ready = step.launch("all-gather", f"{names[i + 1]} ({phase})",
                                    units[names[i + 1]])
            step.compute(phase, compute[phase] * units[name] / sum(units.values()))
            if phase == "backward" and name != "root":
                step.launch("reduce-scatter", name, units[name])
    step.launch("reduce-scatter", "root", units["root"])


def play(sync: int | None, nproc: int, accum_steps: int, compute: dict[str, float],
         buckets: tuple[int, ...], link: AlphaBeta) -> Step:
    """One optimizer step of ``accum_steps`` micro-steps. ``sync``: None (one process), 0
    (DDP's buckets), 1 (Zero1), 2 (Zero2), 3 (fully_shard); ``compute``: the ms of
    "forward", "backward" and "optimizer"; ``buckets``: bytes, in launch order."""
    step, grads = Step(link, nproc), sum(gradient_bytes())
    for k in range(accum_steps):
        if sync == 3:
            _zero3_micro_step(step, compute)
            continue
        step.compute("forward", compute["forward"])
        step.backward_starts.append(step.t)
        if sync == 2 or (sync == 0 and k == accum_steps - 1):  # DDP: no_sync() before
            _backward_by_bucket(step, compute["backward"], buckets,
                                "reduce-scatter" if sync == 2 else "all-reduce", sync == 2)
        else:
            step.compute("backward", compute["backward"])
    step.wait()  # the optimizer needs every gradient
    if sync == 1:  # Zero1.step, after backward: nothing to overlap with
        step.run("all-reduce", "which gradients exist", 4 * len(gradient_bytes()))  # int32s
        step.run("reduce-scatter", "gradients", grads)
        step.run("all-reduce", "gradient norm", 8)  # one float64
    step.compute("optimizer", compute["optimizer"])
    if sync == 1:
        step.run("all-gather", "parameters", grads)
    for i, size in enumerate(buckets if sync == 2 else ()):
        step.launch("all-gather", f"bucket {i}", size)  # Zero2.step: one per bucket
    step.wait()
    return step
