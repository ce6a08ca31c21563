"""Checkers for the exercises of notebook 07 (data-parallel training)."""

from __future__ import annotations

import ast
import math

import torch

from course_lib.check.answers import call, expect_tensor_with_grad
from course_lib.check.cases import dp_step_cases
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import expect_own_code
from course_lib.core.accumulation import scale_by_global_tokens
from course_lib.runtime.workspace import record_pass
from course_lib.tasks.batching import micro_batch_slice

SHARD_CASES = ((32, 2, 1), (32, 2, 4), (32, 4, 2), (24, 3, 2), (8, 1, 8))  # (global, N, K)


def rows_of(answer, global_size: int) -> list[int] | None:
    """The example indices a slice or range names, or None for anything else."""
    if isinstance(answer, slice):
        return list(range(global_size))[answer]
    if isinstance(answer, range):
        return list(answer)
    return None


def whole_bounds(answer) -> bool:
    if not isinstance(answer, (slice, range)):
        return True  # judged by rows_of
    return all(v is None or (isinstance(v, int) and not isinstance(v, bool))
               for v in (answer.start, answer.stop, answer.step))


@exercise("7.1")
def shard_rows(rows_fn) -> None:
    """``rows_fn(global_size, rank, k, world_size, accum_steps)``: the rows of one micro-batch."""
    expect_own_code(rows_fn, micro_batch_slice, "work out the rows yourself, from the sizes")
    for global_size, world, accum in SHARD_CASES:
        for rank in range(world):
            for k in range(accum):
                answer = call(rows_fn, global_size, rank, k, world, accum)
                expect(whole_bounds(answer), "the slice's bounds must be whole numbers (int): "
                                             "/ gives a float even when it divides exactly")
                got = rows_of(answer, global_size)
                expect(got is not None, "return a slice (or a range) of rows of the batch")
                want = rows_of(micro_batch_slice(global_size, rank, k, world, accum),
                               global_size)
                size = global_size // (world * accum)
                expect(len(got) == size,
                       f"a micro-batch holds {size} examples here (global {global_size}, "
                       f"N={world}, K={accum}), yours {len(got)}: the batch is cut into "
                       "world_size x accum_steps equal parts")
                expect(got == want,
                       f"rank {rank}, micro-step {k} (global {global_size}, N={world}, "
                       f"K={accum}): expected rows {want[0]}..{want[-1]}, got "
                       f"{got[0]}..{got[-1]}. Rank r owns the contiguous block r of the batch "
                       "and walks through it in K micro-steps")


def _as_float(value) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def scaled_losses(scale_fn, loss_sums, tokens) -> list[float]:
    """Each rank's loss to backpropagate; checks that backward can go through it."""
    world, global_tokens = len(tokens), sum(tokens)
    scaled = []
    for s, t in zip(loss_sums, tokens, strict=True):
        loss_sum = torch.tensor(s, dtype=torch.float64, requires_grad=True)
        loss = call(scale_fn, loss_sum, t, global_tokens, world)
        expect_tensor_with_grad(loss, "return the loss to call backward on, computed from "
                                      "loss_sum")
        expect(loss.numel() == 1, f"return one number (a 0-d tensor), not {tuple(loss.shape)}")
        scaled.append(_as_float(loss))
    return scaled


@exercise("7.2")
def scale_loss(scale_fn) -> None:
    """``scale_fn(loss_sum, local_tokens, global_tokens, world_size)``: what to backpropagate.

    The gradient sync averages over ranks, so the average of the scaled losses must be the
    mean loss over every token of the global batch.
    """
    expect_own_code(scale_fn, scale_by_global_tokens, "write the scaling yourself")
    cases = (([3.0, 5.0], [10, 30]), ([2.0, 4.0, 1.0, 9.0], [7, 11, 3, 19]), ([6.0], [12]))
    for loss_sums, tokens in cases:
        world, global_tokens = len(tokens), sum(tokens)
        scaled = scaled_losses(scale_fn, loss_sums, tokens)
        averaged = sum(scaled) / world  # what the all-reduce and the division by N leave
        right = sum(loss_sums) / global_tokens  # the mean over every token of the batch
        mean_of_means = sum(s / t for s, t in zip(loss_sums, tokens, strict=True)) / world
        if world > 1:
            expect(not math.isclose(averaged, mean_of_means, rel_tol=1e-9),
                   "each rank divided by its own token count: that averages the ranks' means, "
                   "and tokens on ranks with fewer tokens weigh more")
            expect(not math.isclose(averaged * world, right, rel_tol=1e-9),
                   f"off by a factor world_size ({world} times too small): the sync averages "
                   "over the ranks, so it divides once more than you planned for")
        expect(math.isclose(averaged, right, rel_tol=1e-9),
               f"with token losses {loss_sums} and counts {tokens} the ranks' average should "
               f"be the global token mean {right:.6f}, got {averaged:.6f}: every token of the "
               "global batch must count once, with the same weight")


# ---- one data-parallel step: the learner's own file, launched on 2, 3 and 4 processes -----

MY_DP_STEP_FILE = "workspace/my_dp_step.py"
DP_STEP_CASES = "course_lib.check.cases.dp_step_cases"
SAME_CALLS = ("every rank must call ring_all_reduce on the same gradients, in the same order, "
              "once per step")
DP_STEP_ADVICE = Advice.unpaired(SAME_CALLS, "all-reduces", "all-reduced")
LIBRARY_ANSWERS = {  # what course_lib.core.data_parallel has that would answer for the learner
    "broadcast_parameters": "broadcast_parameters is the library's own "
                            "(course_lib.core.data_parallel): the exercise is to write it yourself",
    "AllReducePerParameter": "the file uses the library's AllReducePerParameter, which is the "
                             "answer itself: accumulate, sync and step in your own code",
}
TORCH_ALL_REDUCE = ("the gradients are averaged with torch's all_reduce: the exercise averages "
                    "them with ring_all_reduce, your ring of exercise 6.3 (the name the file "
                    "defines with mine_or_library)")


def refuse_library_answers(path: str) -> None:
    """Before any launch: the file must not import (or reach for) the library's answer, nor
    torch's all_reduce."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    for name, hint in LIBRARY_ANSWERS.items():
        expect(name not in names, hint)
    expect("all_reduce" not in names, TORCH_ALL_REDUCE)


def judge_broadcast(summary: dict, by_rank: dict, n: int) -> None:
    expect(not summary["library_broadcast"], LIBRARY_ANSWERS["broadcast_parameters"])
    expect(not summary["library_wrapper"], LIBRARY_ANSWERS["AllReducePerParameter"])
    for rank in range(n):
        mine = by_rank[rank]
        if mine["broadcast_right"]:
            continue
        after = f"after broadcast_parameters rank {rank}"
        if mine["broadcast_kept_own"] and "broadcast" in mine["collectives"]:
            expect(False, f"{after} still has its own starting weights, though it called "
                          "dist.broadcast: the tensors it broadcast were not the parameters "
                          "themselves (a copy or a new tensor), so the parameters never changed")
        expect(not mine["broadcast_kept_own"],
               f"{after} still has its own starting weights: here every rank builds its model "
               "from another seed, and nothing gave it rank 0's, so the replicas start apart "
               "and never agree")
        missed = ", ".join(map(str, mine["broadcast_missed"]))
        expect(False, f"{after} holds weights of its own in parameter tensor(s) {missed} (of "
                      f"{mine['parameter_tensors']}, in model.parameters() order): those were "
                      "not given rank 0's values")


def judge_syncs(summary: dict, k: int) -> None:
    """The ring calls of rank 0: once per step, after the last micro-batch, every gradient."""
    params = len(dp_step_cases.flat(dp_step_cases.make_model(0)))
    for number, step in enumerate(summary["steps"], start=1):
        expect(step["losses"] == k, f"step {number} computed {step['losses']} micro-batch "
                                    f"losses for {k} micro-batches: one loss_fn and one "
                                    "backward per micro-batch")
        if not step["syncs"]:
            expect("all_reduce" not in summary["collectives"], TORCH_ALL_REDUCE)
            expect(False, f"step {number} never called ring_all_reduce: the ranks' gradients "
                          "were not averaged, each rank stepped with its own")
        early = [losses for losses, _ in step["syncs"] if losses < k]
        first = early[0] if early else 0
        expect(not early, f"ring_all_reduce ran after micro-batch {first} of {k}: a sync on "
                          f"every micro-step sends {k} times the bytes for the same result, "
                          "since the ranks' sum of the accumulated gradients is needed once")
        reduced = sum(numel for _, numel in step["syncs"])
        expect(reduced == params, f"step {number} all-reduced {reduced} numbers; the model has "
                                  f"{params} parameters: every gradient must be reduced "
                                  "exactly once")


SCALE_HINTS = {
    "n": "not divided by the world size: ring_all_reduce leaves the SUM of the ranks' "
         "gradients, and the step needs their mean",
    "k": "each micro-batch's loss is a mean, and K backward passes add up K means: the "
         "gradient of the K micro-batches together is their mean, not their sum",
    "either": "either the ring's sum over the ranks is not divided by the world size, or each "
              "micro-batch's loss (a mean) is not divided by the number of micro-batches",
    "nk": "not divided by the world size (the ring gives the sum over ranks) nor by the number "
          "of micro-batches (K backward passes add up K means)",
}


def name_scale_mistake(spec: dict, n: int, got: torch.Tensor) -> None:
    k = spec["accum_steps"]
    scales = [("n", n), ("k", k), ("nk", n * k)] if n != k else [("either", n), ("nk", n * k)]
    for key, scale in scales:
        if scale == 1 or (key == "nk" and 1 in (n, k)):
            continue
        wrong = torch.tensor(dp_step_cases.reference_parameters(spec, n, scale))
        if torch.allclose(got, wrong, rtol=1e-9, atol=1e-12):
            expect(False, f"the gradient is {scale} times too large: {SCALE_HINTS[key]}")


def name_step_mistake(spec: dict, n: int, got: torch.Tensor) -> None:
    """Rank 0's parameters are not the reference's: name a known cause, else the symptom."""
    name_scale_mistake(spec, n, got)
    kept = torch.tensor(dp_step_cases.reference_parameters(spec, n, keep_grads=True))
    expect(not torch.allclose(got, kept, rtol=1e-9, atol=1e-12),
           "step 2 used the gradients of step 1 as well: backward adds into .grad, and "
           "nothing emptied it between the steps")
    want = torch.tensor(dp_step_cases.reference_parameters(spec, n))
    gap = float((got - want).abs().max())
    expect(False, f"after {dp_step_cases.STEPS} steps rank 0's parameters differ from one "
                  f"process stepping on the whole batch (by up to {gap:.2e}): every step "
                  "must use the mean gradient of the whole global batch")


def judge_dp_case(summary: dict, by_rank: dict, run) -> None:
    n, k = summary["ranks"], summary["accum_steps"]
    spec = {s["name"]: s for s in dp_step_cases.case_specs(n, {})}[summary["name"]]
    judge_broadcast(summary, by_rank, n)
    judge_syncs(summary, k)
    want = torch.tensor(dp_step_cases.reference_parameters(spec, n))
    got = torch.tensor(by_rank[0]["params"])
    if not torch.allclose(got, want, rtol=1e-9, atol=1e-12):
        name_step_mistake(spec, n, got)
    for rank in range(1, n):
        expect(by_rank[rank]["params"] == by_rank[0]["params"],
               f"rank {rank}'s parameters are not rank 0's, bit for bit: every rank must take "
               "the same step, from the same averaged gradients")


@exercise("7.3")
def my_dp_step(path: str = MY_DP_STEP_FILE, world_sizes=WORLD_SIZES) -> None:
    """``broadcast_parameters`` and ``data_parallel_step`` in the learner's file."""
    learner = find_learner_file(path, ("broadcast_parameters", "data_parallel_step"))
    refuse_library_answers(path)
    check_file(learner, DP_STEP_CASES, {}, world_sizes, DP_STEP_ADVICE, judge_dp_case,
               deadline_s=dp_step_cases.DEADLINE_S)
    record_pass("7.3", path)
