"""The capstone's budget (notebook 11, exercise 11.2): one run, a memory cap and a time cap.

    from course_lib.lessons.budget import Budget, Plan, memory_kib, step_ms, verdict
    plan = Plan(micro_batch=4, accum_steps=4, nproc=2, bucket_kib=128, zero1=False)
    memory_kib(plan)        # {"parameters": ..., "total": ...} per process, in KiB
    step_ms(plan)           # {"compute": ..., "communication": ..., "total": ...} per step
    verdict(plan, Budget()) # [] when the plan fits both caps; else what broke, by how much

The run is fixed: 100 optimizer steps of a global batch of 32 with the course's trainer, the
recipe that reaches the target loss; any split of it reaches the same loss (the ladder of
exercise 11.1). What the plan changes is memory and time.

Memory is measured, as in notebook 02 (``capstone.memory_per_process``), plus the gradient
buckets the sync keeps (one more copy of the gradients); ZeRO-1 (notebook 10) keeps 1/N of
the optimizer state. Time is a model, not a clock, so that every machine gets the same
answer: a micro-step costs a fixed overhead plus a cost per example (``Machine``), and the
all-reduce of each bucket costs what the alpha-beta model of notebooks 05-06 predicts. The
buckets are sent while the last micro-step's backward runs (notebook 08); the last bucket
cannot start before backward ends. ZeRO-1 reduce-scatters instead (half the messages) and
all-gathers the new parameters after the step, which nothing hides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.lessons import capstone
from course_lib.lessons.capstone import KIB
from course_lib.lessons.cost_model import AlphaBeta


@dataclass(frozen=True)
class Machine:
    """The challenge's machine: a few numbers, stated rather than measured."""

    micro_step_ms: float = 4.0  # forward + backward of one micro-step, whatever its size
    per_example_ms: float = 1.0  # ... plus this much per example in it
    backward_share: float = 2 / 3  # backward's part of a micro-step (about twice the forward)
    link: AlphaBeta = AlphaBeta(alpha_s=0.5e-3, beta_s_per_byte=1e-8)  # 0.5 ms, 100 MB/s
    max_nproc: int = 4  # processes it can run at once


@dataclass(frozen=True)
class Budget:
    """The run and its two limits."""

    global_batch: int = 32  # examples per optimizer step: the recipe's
    steps: int = 100  # optimizer steps: the recipe's
    memory_cap_kib: float = 900.0  # per process
    time_cap_s: float = 2.0  # for the whole run
    machine: Machine = Machine()


@dataclass(frozen=True)
class Plan:
    """The choices."""

    micro_batch: int  # examples in one forward and backward
    accum_steps: int  # micro-steps per optimizer step, on each process
    nproc: int  # processes, each with a copy of the model
    bucket_kib: float  # gradients per all-reduce message (DDP's bucket_cap_mb, in KiB)
    zero1: bool  # shard the optimizer state over the processes (notebook 10)

    @property
    def global_batch(self) -> int:
        return self.nproc * self.accum_steps * self.micro_batch


def memory_kib(plan: Plan) -> dict[str, float]:
    """What one process holds at its peak, in KiB."""
    parts = capstone.memory_per_process(plan.micro_batch)
    shards = plan.nproc if plan.zero1 else 1
    kib = {"parameters": parts["parameters"] / KIB, "gradients": parts["gradients"] / KIB,
           "buckets": parts["gradients"] / KIB,  # the sync's flat copy of the gradients
           "optimizer state": parts["optimizer state"] / KIB / shards,  # ZeRO-1: 1/N each
           "activations": parts["activations"] / KIB}  # one micro-batch's, at a time
    kib["total"] = sum(kib.values())
    return kib


def bucket_sizes(nbytes: int, bucket_bytes: float) -> list[int]:
    """The gradient cut into buckets of at most ``bucket_bytes`` (the last one smaller)."""
    count = max(1, math.ceil(nbytes / bucket_bytes))
    return [min(bucket_bytes, nbytes - i * bucket_bytes) for i in range(count)]


def message_ms(machine: Machine, nbytes: float, nproc: int, messages: int) -> float:
    """``messages`` ring steps of nbytes / nproc each (2(N-1) for all-reduce, N-1 for a
    reduce-scatter or an all-gather)."""
    return 1e3 * messages * machine.link.time_s(nbytes / nproc)


def step_ms(plan: Plan, machine: Machine | None = None) -> dict[str, float]:
    """Milliseconds of one optimizer step, on every process at once."""
    m = machine or Machine()
    micro_ms = m.micro_step_ms + m.per_example_ms * plan.micro_batch
    compute = plan.accum_steps * micro_ms  # one micro-step after the other
    n = plan.nproc
    if n == 1:
        return {"compute": compute, "communication": 0.0, "total": compute}
    grad_bytes = capstone.memory_per_process(1)["gradients"]
    rounds = n - 1 if plan.zero1 else 2 * (n - 1)  # reduce-scatter is half an all-reduce
    buckets = [message_ms(m, b, n, rounds) for b in
               bucket_sizes(grad_bytes, plan.bucket_kib * KIB)]
    hidden = m.backward_share * micro_ms  # the last backward runs while buckets are sent
    exposed = max(sum(buckets) - hidden, buckets[-1])  # the last bucket waits for backward
    if plan.zero1:
        exposed += message_ms(m, grad_bytes, n, n - 1)  # all-gather the new parameters
    return {"compute": compute, "communication": exposed, "total": compute + exposed}


def run_seconds(plan: Plan, budget: Budget) -> float:
    return budget.steps * step_ms(plan, budget.machine)["total"] / 1e3


def rule_problems(plan: Plan, budget: Budget) -> list[str]:
    """What makes the plan another run, or impossible, before memory and time."""
    problems = []
    for name in ("micro_batch", "accum_steps", "nproc"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be a whole number >= 1, got {value!r}")
    if not isinstance(plan.zero1, bool):
        problems.append(f"zero1 must be True or False, got {plan.zero1!r}")
    if isinstance(plan.bucket_kib, bool) or not isinstance(plan.bucket_kib, (int, float)):
        problems.append(f"bucket_kib must be a number of KiB, got {plan.bucket_kib!r}")
    if problems:
        return problems
    if plan.global_batch != budget.global_batch:
        problems.append(f"global batch {plan.nproc} x {plan.accum_steps} x {plan.micro_batch}"
                        f" = {plan.global_batch}, but the recipe that reaches the target "
                        f"loss uses {budget.global_batch}: another global batch is another run")
    if plan.nproc > budget.machine.max_nproc:
        problems.append(f"{plan.nproc} processes, but the machine runs at most "
                        f"{budget.machine.max_nproc}")
    if not plan.bucket_kib > 0:
        problems.append(f"bucket_kib must be more than 0, got {plan.bucket_kib!r}")
    return problems


def verdict(plan: Plan, budget: Budget) -> list[str]:
    """[] when the plan keeps the recipe and fits both caps; else one line per broken limit,
    with the figure."""
    problems = rule_problems(plan, budget)
    if problems:
        return problems
    memory, seconds = memory_kib(plan)["total"], run_seconds(plan, budget)
    if memory > budget.memory_cap_kib:
        problems.append(f"memory: {memory:.0f} KiB per process, over the "
                        f"{budget.memory_cap_kib:.0f} KiB cap by "
                        f"{memory - budget.memory_cap_kib:.0f} KiB")
    if seconds > budget.time_cap_s:
        problems.append(f"time: {seconds:.2f} s for {budget.steps} steps, over the "
                        f"{budget.time_cap_s:.2f} s cap by {seconds - budget.time_cap_s:.2f} s")
    return problems
