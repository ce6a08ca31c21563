"""Checkers for the exercises of notebook 11 (capstone).

11.1 launches the learner's trainer (``workspace/capstone_trainer.py``) on 2 processes and
climbs the course's equivalence ladder, rung by rung; the report names the first rung that
fails and what to look at. 11.2 judges a plan against the memory cap and the time cap, part by
part (``course_lib.lessons.budget``), and compares it with the fastest plan that fits, found by
trying every plan.
"""

from __future__ import annotations

from course_lib.check.checker import ExerciseError, exercise, expect
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.runner import run_file
from course_lib.check.mp.verdict import Advice, raise_if_stopped
from course_lib.lessons import budget
from course_lib.runtime.workspace import record_pass

TRAINER_FILE = "workspace/capstone_trainer.py"
FUNCTIONS = ("same_start", "train_step", "epoch_orders")
CASES = "course_lib.check.cases.capstone_cases"
RUNGS = (  # (the case it reads, what it claims), in the order they are climbed
    ("one micro-step", "one micro-step on one process = one big batch"),
    ("K micro-steps", "K micro-steps on one process = one big batch"),
    ("N processes", "N processes x K micro-steps = one big batch"),
    ("N processes", "the gradients are synced once per optimizer step"),
    ("same start", "every replica holds the same weights, bit for bit"),
    ("N processes", "the logged loss is the global batch's, on every rank"),
    ("epochs", "each epoch a new order, every example once, on no two ranks"),
)
ADVICE = Advice(all_send="every rank must call the same collectives in the same order.",
                all_recv="every rank must call the same collectives in the same order.",
                mismatch="every rank must call the same collectives in the same order.",
                size="every rank must call the same collectives in the same order.")
PG_TIMEOUT_S = 60.0  # rank 1 waits while rank 0 runs the one-process cases alone; the one
#                     hang that a bug causes (a skipped broadcast) ends as soon as rank 0 exits
CLOSE = 1e-9  # float64: a right answer is off by rounding only


def _gradient_hint(s: dict) -> str:
    k, ratio = s["accum_steps"], s["grad_ratio"]
    if ratio is None:
        return "some parameters have no gradient after train_step: does backward run?"
    if s["ranks"] == 1 and k > 1 and abs(ratio - k) < 0.2 * k:
        return (f"with {k} micro-steps the gradient is about {k} times the big batch's: each "
                "backward adds its micro-step's whole gradient into .grad. What should each "
                "micro-step's loss be a share of?")
    if s["ranks"] > 1 and abs(ratio * s["ranks"] - 1) < 0.2:
        return (f"on {s['ranks']} processes the gradient is {s['ranks']} times too small: "
                "DDP averages the ranks' gradients; what does that do to your scaling?")
    return (f"the gradient is off by up to {s['grad_error']:.1%} of its largest entry, with "
            "the same examples: micro-batches hold different numbers of scored tokens. "
            "What is each micro-step's token sum divided by?")


def _judge_step(s: dict) -> None:
    expect(s["grad_error"] is not None and s["grad_error"] < CLOSE, _gradient_hint(s))


def _judge_syncs(by_rank: dict) -> None:
    for rank, s in sorted(by_rank.items()):
        expect(s["syncs"] == 1,
               f"rank {rank} all-reduced its gradients {s['syncs']} times in one optimizer "
               f"step of {s['accum_steps']} micro-steps (the values are right, the time is "
               "not). DDP decides in forward whether the coming backward syncs: look at what "
               "no_sync() wraps")


def _judge_replicas(step_runs: dict, start: dict | None) -> None:
    digests = {s["digest"] for s in step_runs.values()}
    expect(len(digests) == 1, "after one step the ranks hold different weights: every rank "
                              "must apply the same gradient to the same weights")
    if start is None:
        return
    for rank, s in sorted(start.items()):
        expect(s["digest"] == s["rank0_digest"],
               f"after same_start rank {rank} does not hold rank 0's weights: does every "
               "tensor of the model reach every rank?")


def _judge_loss(by_rank: dict) -> None:
    losses = {rank: s["loss"] for rank, s in by_rank.items()}
    expect(None not in losses.values(), "train_step must return the step's loss, a number")
    expect(len(set(losses.values())) == 1,
           f"the ranks logged different losses {sorted(losses.values())}: each rank sees "
           "only its share of the batch")
    ref = next(iter(by_rank.values()))["ref_loss"]
    micro = sum(s["micro_mean_loss"] for s in by_rank.values()) / len(by_rank)
    got = losses[0]
    expect(abs(got - micro) > CLOSE or abs(micro - ref) < CLOSE,
           f"the logged loss {got:.4f} is the mean of the micro-batches' means; the global "
           f"batch's loss is {ref:.4f}: its micro-batches hold different numbers of tokens")
    expect(abs(got - ref) < CLOSE, f"the logged loss {got:.4f} is not the global batch's "
                                   f"mean over its scored tokens, {ref:.4f}")


def _judge_epochs(by_rank: dict) -> None:
    orders = {rank: s["orders"] for rank, s in sorted(by_rank.items())}
    size = next(iter(by_rank.values()))["dataset_size"]
    first = orders[0]
    expect(len(first) >= 2 and first[0] != first[1],
           f"rank 0 gets the same examples in the same order in epoch 0 and epoch 1: "
           f"{first[0][:5]}...: what makes the sampler shuffle differently in the next epoch?")
    for epoch in range(len(first)):
        seen = [i for rank in orders for i in orders[rank][epoch]]
        expect(set(seen) == set(range(size)),
               f"in epoch {epoch} the ranks together skip examples: a sampler per rank must "
               "know its rank and the world size")
        expect(len(seen) - len(set(seen)) < len(orders),
               f"in epoch {epoch} the ranks train on the same examples: a sampler per rank "
               "must know its rank and the world size")


def _climb(results: dict) -> list[str]:
    """Judge rung after rung; return the rungs passed; raise at the first that fails."""
    passed = []
    for number, (case, claim) in enumerate(RUNGS, start=1):
        by_rank = results.get(case)
        try:
            if by_rank is None:
                return passed  # its case did not finish: the launch's ending says why
            s = by_rank[0]
            if number <= 3:
                _judge_step(s)
                if number == 3:
                    for r in by_rank.values():
                        _judge_step(r)
            elif number == 4:
                _judge_syncs(by_rank)
            elif number == 5:
                _judge_replicas(results["N processes"], by_rank)
            elif number == 6:
                _judge_loss(by_rank)
            else:
                _judge_epochs(by_rank)
        except ExerciseError as e:
            raise ExerciseError(_rung_report(number, e.hint)) from None
        passed.append(f"rung {number}: {claim}")
    return passed


def _rung_report(number: int, hint: str) -> str:
    return (f"rung {number} of {len(RUNGS)} fails: {RUNGS[number - 1][1]}. "
            f"{hint[:1].upper()}{hint[1:]}")


def _first_unfinished(results: dict) -> int:
    return next(i for i, (case, _) in enumerate(RUNGS, 1) if case not in results)


@exercise("11.1")
def capstone_trainer(path: str = TRAINER_FILE, world_size: int = 2) -> None:
    """The learner's trainer, launched on ``world_size`` processes, against the ladder."""
    if _still_open(path):
        raise NotImplementedError(path)
    learner = find_learner_file(path, FUNCTIONS)
    run = run_file(CASES, learner, world_size, pg_timeout_s=PG_TIMEOUT_S, deadline_s=180)
    results = {s["name"]: by_rank for s, by_rank in run.finished_cases()}
    passed = _climb(results)
    if len(passed) < len(RUNGS):
        number, waiting = _first_unfinished(results), _waiting_rank(run)
        if waiting:
            raise ExerciseError(_rung_report(number, waiting))
        try:
            raise_if_stopped(run, learner, ADVICE)
        except ExerciseError as e:
            raise ExerciseError(_rung_report(number, e.hint)) from None
        raise RuntimeError(f"the checker itself failed; please report this: {run.launch_error}")
    for line in passed:
        print(line)
    record_pass("11.1", path)


def _still_open(path: str) -> bool:
    """The student copy's file: only the exercise's marked line."""
    try:
        with open(path, encoding="utf-8") as f:
            return 'NotImplementedError("Exercise 11.1' in f.read()
    except OSError:
        return False


def _waiting_rank(run) -> str:
    """A rank left waiting in a collective that a peer never called (the peer went on);
    "" when the launch ended otherwise."""
    if any(r.error and r.error["kind"] == "learner" for r in run.ranks):
        return ""
    for r in run.ranks:
        e = r.error or {}
        if e.get("kind") in ("peer_gone", "timeout") and e.get("line"):
            others = ", ".join(str(o.rank) for o in run.ranks if o.rank != r.rank)
            code = e['source'].split('#')[0].strip()
            return (f"rank {r.rank} waited at line {e['line']}, {code}, and rank "
                    f"{others} never joined it: a collective completes only when every rank "
                    "of the group calls it")
    return ""


@exercise("11.2")
def capstone_budget(my_plan, challenge: budget.Budget | None = None) -> None:
    """``my_plan()`` returns a ``budget.Plan``; it must keep the recipe and fit both caps."""
    challenge = challenge or budget.Budget()
    plan = my_plan()
    expect(isinstance(plan, budget.Plan), f"return a Plan(micro_batch, accum_steps, nproc, "
                                          f"bucket_kib, zero_stage), not {plan!r}")
    problems = budget.verdict(plan, challenge)
    expect(not problems, "\n".join(problems))  # each limit on lines of its own
    for line in budget.describe(plan, challenge):
        print(line)
    best = budget.fastest_plan(challenge)  # every plan tried: none is faster
    seconds, fastest = (budget.run_seconds(p, challenge) for p in (plan, best))
    if seconds <= fastest + 1e-9:
        print("of every plan that fits, none is faster (every plan was tried)")
    else:
        print(f"the fastest plan that fits takes {fastest:.3f} s, yours {seconds:.3f} s "
              "(every plan was tried)")
