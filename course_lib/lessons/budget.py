"""The capstone's budget (notebook 11, exercise 11.2): one run, a memory cap and a time cap.

    from course_lib.lessons.budget import Budget, Plan, memory_kib, step_ms, verdict
    plan = Plan(micro_batch=4, accum_steps=4, nproc=2, bucket_kib=32, zero_stage=0)
    memory_kib(plan)          # {"parameters": ..., "total": ...} per process, in KiB
    step_ms(plan)             # {"compute": ..., "communication": ..., "total": ...} per step
    verdict(plan, Budget())   # [] when the plan fits both caps; else each limit it breaks, why
    fastest_plan(Budget())    # the fastest plan that fits, found by trying every choice
    splits_that_fit(Budget())  # {(processes, accum steps, micro-batch): the plans that fit}

The run is fixed: 100 optimizer steps of a global batch of 32 with the course's trainer, the
recipe that reaches the target loss; any split of it reaches the same loss (the ladder of
exercise 11.1). What the plan changes is memory and time, both priced by the course's models,
with figures fixed in ``Machine`` so that every machine gets the same verdict:

- compute: forward and backward each cost a fixed time plus a time per example, measured on
  the course's CPU (``capstone.measure_compute``); the micro-steps of a process run one after
  the other, then AdamW steps once;
- communication: the alpha-beta model of notebooks 05 and 06b, with a frozen reference fit of
  notebook 05's alpha and beta (one run on the course's CPU); a ring all-reduce of n bytes on
  N processes costs 2(N-1) alpha + 2(N-1)/N n beta, a reduce-scatter or an all-gather half of
  that (``capstone.play`` plays a step out).

Memory is measured, as in notebook 02 (``capstone.memory_per_process``), each part divided as
the ZeRO stage of notebook 10 says, plus what the sync keeps (``SYNC_PART``).
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, replace

from course_lib.core.buckets import plan_buckets
from course_lib.lessons import capstone
from course_lib.lessons.capstone import KIB
from course_lib.lessons.cost_model import AlphaBeta

STAGES = {0: "plain data parallel", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
SYNC_PART = {0: "buckets", 1: "flat gradient", 2: "buckets in flight", 3: "gathered modules"}
DDP_CAP_KIB = 25 * 1024  # DDP's default bucket_cap_mb, 25 MB


@dataclass(frozen=True)
class Machine:
    """The figures a plan is priced with: the course's frozen reference figures, measured once
    on its 2-core CPU and fixed here (compute: ``capstone.measure_compute(repeats=50)``,
    rounded; link: one fit of notebook 05's ping-pong, which differs from run to run). Price
    with yours: ``Machine(link=AlphaBeta(alpha, beta), **capstone.measure_compute())``."""

    link: AlphaBeta = AlphaBeta(alpha_s=38.7e-6, beta_s_per_byte=1 / 4.70e9)  # frozen reference fit
    forward_ms: float = 1.25  # the trainer's forward of a micro-batch, whatever its size ...
    forward_ms_per_example: float = 0.042  # ... plus this much per example in it
    backward_ms: float = 1.30  # the same for backward
    backward_ms_per_example: float = 0.048
    optimizer_ms: float = 1.5  # one AdamW step (once per optimizer step)
    max_nproc: int = 4  # processes it can run at once


@dataclass(frozen=True)
class Budget:
    """The run and its two limits."""

    global_batch: int = 32  # examples per optimizer step: the recipe's
    steps: int = 100  # optimizer steps: the recipe's
    memory_cap_kib: float = 900.0  # per process
    time_cap_s: float = 0.9  # for the whole run: three splits of the 32 examples fit
    machine: Machine = Machine()


@dataclass(frozen=True)
class Plan:
    """The choices."""

    micro_batch: int  # examples in one forward and backward
    accum_steps: int  # micro-steps per optimizer step, on each process
    nproc: int  # processes
    bucket_kib: float = DDP_CAP_KIB  # bucket cap, DDP's bucket_cap_mb in KiB (stages 0, 2)
    zero_stage: int = 0  # 0: plain data parallel; 1, 2, 3: ZeRO (notebook 10)

    @property
    def global_batch(self) -> int:
        return self.nproc * self.accum_steps * self.micro_batch


@functools.lru_cache(maxsize=1024)
def buckets(bucket_kib: float) -> tuple[int, ...]:
    """Bytes of each bucket, in launch order: whole tensors, the last layer's first, a bucket
    closed before the next tensor would pass the cap (``core.buckets.plan_buckets``)."""
    sizes = capstone.gradient_bytes()[::-1]  # backward makes the last layer's gradient first
    plan = plan_buckets(sizes, [None] * len(sizes), bucket_kib * KIB)  # one dtype and device
    return tuple(sum(sizes[i] for i in members) for members in plan)


def _played(plan: Plan, machine: Machine) -> capstone.Step:
    return _play(plan, replace(machine, max_nproc=1))  # how many it has changes no step


@functools.lru_cache(maxsize=4096)
def _play(plan: Plan, machine: Machine) -> capstone.Step:
    compute = {"forward": machine.forward_ms + machine.forward_ms_per_example * plan.micro_batch,
               "backward": machine.backward_ms
               + machine.backward_ms_per_example * plan.micro_batch,
               "optimizer": machine.optimizer_ms}
    sync = plan.zero_stage if plan.nproc > 1 else None  # one process: nothing to sync
    bucket_list = buckets(plan.bucket_kib) if sync in (0, 2) else ()
    return capstone.play(sync, plan.nproc, plan.accum_steps, compute, bucket_list,
                         machine.link)


def step_ms(plan: Plan, machine: Machine | None = None) -> dict[str, float]:
    """Milliseconds of one optimizer step: compute, the communication that compute does not
    hide (the step waits for it), their total, and how long the link was busy; and the KiB
    one process sent."""
    s = _played(plan, machine or Machine())
    return {"compute": s.compute_ms, "communication": s.end_ms - s.compute_ms,
            "total": s.end_ms, "link busy": s.link_ms, "sent KiB": s.sent_bytes / KIB}


def timeline(plan: Plan, machine: Machine | None = None, whole_step: bool = False) -> list[dict]:
    """The last backward and the collectives after its start (``timeline_plot``'s events, in
    seconds from that start); ``whole_step``: every compute and collective of the step."""
    return _played(plan, machine or Machine()).events_from(whole_step)


def memory_kib(plan: Plan, machine: Machine | None = None) -> dict[str, float]:
    """What one process holds at its peak, in KiB, part by part, and the total."""
    parts = {k: v / KIB for k, v in capstone.memory_per_process(plan.micro_batch).items()}
    n, stage = plan.nproc, plan.zero_stage if plan.nproc > 1 else 0
    kib = {"parameters": parts["parameters"] / (n if stage == 3 else 1),
           "gradients": parts["gradients"] / (n if stage >= 2 else 1),
           "optimizer state": parts["optimizer state"] / (n if stage >= 1 else 1),
           "activations": parts["activations"]}  # one micro-batch's, at a time
    if n > 1:
        kib[SYNC_PART[stage]] = _sync_bytes(plan, machine or Machine()) / KIB
    kib["total"] = sum(kib.values())
    return kib


def _sync_bytes(plan: Plan, machine: Machine) -> float:
    grads = sum(capstone.gradient_bytes())
    if plan.zero_stage in (0, 1):
        return grads  # DDP's buckets, or Zero1's flat gradient: a copy of every gradient
    if plan.zero_stage == 2:
        return _played(plan, machine).peak_held_bytes  # a bucket: first gradient to its end
    (_, root), *blocks = capstone.shard_units()
    largest = max(size for _, size in blocks)  # the root whole through forward (notebook 10b),
    return root + 3 * largest  # a block computing, one prefetched, a block's full gradient


def run_seconds(plan: Plan, budget: Budget) -> float:
    return budget.steps * step_ms(plan, budget.machine)["total"] / 1e3


def rule_problems(plan: Plan, budget: Budget) -> list[str]:
    """What makes the plan another run, or impossible, before memory and time."""
    problems = []
    for name in ("micro_batch", "accum_steps", "nproc"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            problems.append(f"{name} must be a whole number >= 1, got {value!r}")
    if plan.zero_stage not in STAGES or isinstance(plan.zero_stage, bool):
        problems.append(f"zero_stage must be 0, 1, 2 or 3, got {plan.zero_stage!r}")
    if isinstance(plan.bucket_kib, bool) or not isinstance(plan.bucket_kib, numbers.Real):
        problems.append(f"bucket_kib must be a number of KiB, got {plan.bucket_kib!r}")
    elif not plan.bucket_kib > 0:
        problems.append(f"bucket_kib must be more than 0, got {plan.bucket_kib!r}")
    if problems:
        return problems
    if plan.global_batch != budget.global_batch:
        problems.append(f"global batch: {plan.nproc} process{'es' * (plan.nproc > 1)} x "
                        f"{plan.accum_steps} accumulation step{'s' * (plan.accum_steps > 1)} "
                        f"x {plan.micro_batch} example{'s' * (plan.micro_batch > 1)} = "
                        f"{plan.global_batch}, but the recipe that reaches the target loss "
                        f"uses {budget.global_batch}: another global batch is another run")
    if plan.nproc == 1 and plan.zero_stage:
        problems.append(f"zero_stage={plan.zero_stage} on one process: ZeRO divides parts "
                        "among processes, and one process has no one to share them with; "
                        "use zero_stage=0 with nproc=1, or more processes")
    if plan.nproc > budget.machine.max_nproc:
        problems.append(f"{plan.nproc} processes, but the machine runs at most "
                        f"{budget.machine.max_nproc}")
    return problems


def _parts(values: dict[str, float], unit: str) -> str:
    """"name figure, ..." largest first."""
    ranked = sorted(values.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {value:.0f}" for name, value in ranked) + f" {unit}"


def describe(plan: Plan, budget: Budget) -> list[str]:
    """The plan's memory and time, each with its parts, against the caps."""
    kib = memory_kib(plan, budget.machine)
    total = kib.pop("total")
    ms = step_ms(plan, budget.machine)
    compute_s, exposed_s = (budget.steps * ms[k] / 1e3 for k in ("compute", "communication"))
    return [f"memory: {total:.0f} KiB per process (cap {budget.memory_cap_kib:.0f}): "
            f"{_parts(kib, 'KiB')}",
            f"time: {run_seconds(plan, budget):.2f} s for {budget.steps} steps (cap "
            f"{budget.time_cap_s:.2f} s): compute {compute_s:.2f} s, communication not "
            f"hidden by compute {exposed_s:.2f} s"]


SYNC_WHY = {"buckets": "DDP's copy of every gradient",
            "flat gradient": "Zero1's copy of every gradient",
            "buckets in flight": "buckets waiting for the link",
            "gathered modules": "the root and two blocks whole, a block's gradient"}


def _why(part: str, plan: Plan) -> str:
    """What a memory part is, for this plan."""
    n, stage = plan.nproc, plan.zero_stage if plan.nproc > 1 else 0
    sharded = {"parameters": stage == 3, "gradients": stage >= 2, "optimizer state": stage >= 1}
    if part == "activations":
        return f"{plan.micro_batch} example{'s' * (plan.micro_batch > 1)} at a time"
    if part in sharded:
        return f"1/{n} on each process" if sharded[part] else "whole on each process"
    return SYNC_WHY[part]


def _micro_steps(count: int, examples: int) -> str:
    return f"{count} micro-step{'s' * (count > 1)} of {examples} example{'s' * (examples > 1)}"


def memory_problem(plan: Plan, budget: Budget) -> str | None:
    """The memory over the cap, by how much, and every part of it with what it is."""
    kib = memory_kib(plan, budget.machine)
    total, cap = kib.pop("total"), budget.memory_cap_kib
    if total <= cap:
        return None
    parts = ", ".join(f"{name} {value:.0f} KiB ({_why(name, plan)})"
                      for name, value in sorted(kib.items(), key=lambda item: -item[1]))
    return (f"memory: {total:.0f} KiB per process, {total - cap:.0f} KiB over the {cap:.0f} "
            f"KiB cap: {parts}")


def time_problem(plan: Plan, budget: Budget) -> str | None:
    """The time over the cap, by how much, its parts, and which part takes it over."""
    seconds, cap = run_seconds(plan, budget), budget.time_cap_s
    if seconds <= cap:
        return None
    ms = step_ms(plan, budget.machine)
    compute_s, exposed_s = (budget.steps * ms[k] / 1e3 for k in ("compute", "communication"))
    head = (f"time: {seconds:.2f} s for {budget.steps} steps, {seconds - cap:.2f} s over the "
            f"{cap:.2f} s cap: compute {compute_s:.2f} s ("
            f"{_micro_steps(plan.accum_steps, plan.micro_batch)} a step, then the optimizer), "
            f"communication not hidden by compute {exposed_s:.2f} s")
    if compute_s > cap:
        return head + "; the compute alone is over the cap"
    return head + "; the compute fits, the communication it does not hide takes it over"


def verdict(plan: Plan, budget: Budget) -> list[str]:
    """[] when the plan keeps the recipe and fits both caps; else one line per broken limit,
    with the figures."""
    problems = rule_problems(plan, budget)
    if problems:
        return problems
    return [p for p in (memory_problem(plan, budget), time_problem(plan, budget)) if p]


@functools.cache
def distinct_caps_kib() -> tuple[float, ...]:
    """One cap per way of cutting the gradients into buckets, the smallest that cuts it so:
    any cap cuts as the largest of these at or below it does (below them all, as the first)."""
    sizes = capstone.gradient_bytes()[::-1]
    runs = {sum(sizes[i:j]) for i in range(len(sizes)) for j in range(i + 1, len(sizes) + 1)}
    found = {}
    for cap in sorted(runs):  # the plan changes only where a cap passes a run's sum
        found.setdefault(buckets(cap / KIB), cap / KIB)
    return tuple(sorted(found.values()))


def every_plan(budget: Budget) -> list[Plan]:
    """Every plan the machine can run that keeps the recipe; bucket caps: one per cut."""
    plans = []
    for nproc in range(1, budget.machine.max_nproc + 1):
        for micro in range(1, budget.global_batch + 1):
            if budget.global_batch % (nproc * micro):
                continue
            accum = budget.global_batch // (nproc * micro)
            for stage in STAGES if nproc > 1 else (0,):
                caps = distinct_caps_kib() if stage in (0, 2) and nproc > 1 else [DDP_CAP_KIB]
                plans += [Plan(micro, accum, nproc, cap, stage) for cap in caps]
    return plans


@functools.lru_cache(maxsize=16)
def fitting_plans(budget: Budget) -> tuple[Plan, ...]:
    """Every plan that keeps the recipe and fits both caps: the plans 11.2's checker accepts."""
    return tuple(p for p in every_plan(budget) if not verdict(p, budget))


def splits_that_fit(budget: Budget) -> dict[tuple[int, int, int], list[Plan]]:
    """The fitting plans by their split of the global batch, (processes, accumulation steps,
    micro-batch): one family of good answers per split."""
    families: dict[tuple[int, int, int], list[Plan]] = {}
    for plan in fitting_plans(budget):
        families.setdefault((plan.nproc, plan.accum_steps, plan.micro_batch), []).append(plan)
    return families


def fastest_plan(budget: Budget) -> Plan | None:
    """The fastest plan that fits both caps (the least memory among equally fast ones);
    None when none fits."""
    return min(fitting_plans(budget), key=lambda p: (round(run_seconds(p, budget), 9),
                                                     memory_kib(p, budget.machine)["total"]),
               default=None)
