"""Checkers for the exercises of notebook 07 (data-parallel training)."""

from __future__ import annotations

import math

import torch

from course_lib.check.answers import call, expect_tensor_with_grad
from course_lib.check.checker import exercise, expect
from course_lib.check.mp import dp_step_cases
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


@exercise("7.1", pointer=(
    "Number the micro-batches of the global batch in order: all K micro-batches of rank 0 "
    "first, then those of rank 1, and so on. Which number does micro-step k of rank r get, "
    "and how many rows does each micro-batch hold? Multiply to find the first row; keep every "
    "number an int (// divides whole numbers)."))
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


@exercise("7.2", pointer=(
    "After the sync, the gradient is the AVERAGE over the N ranks of what each rank "
    "backpropagated. You want the gradient of (sum of every token's loss) / (global token "
    "count). So the N ranks' losses must add up to N times that mean: which factor, the same "
    "on every rank, turns loss_sum into its share? Keep it a tensor (no .item())."))
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
DP_STEP_CASES = "course_lib.check.mp.dp_step_cases"
SAME_CALLS = ("every rank must call ring_all_reduce on the same gradients, in the same order, "
              "once per step")
DP_STEP_ADVICE = Advice(all_send=f"The ranks' all-reduces did not pair up: {SAME_CALLS}.",
                        all_recv=f"The ranks' all-reduces did not pair up: {SAME_CALLS}.",
                        mismatch=f"The ranks' all-reduces did not pair up: {SAME_CALLS}.",
                        size=f"Two ranks all-reduced tensors of different sizes: {SAME_CALLS}.")


def judge_broadcast(summary: dict, by_rank: dict, n: int) -> None:
    expect(not summary["library_broadcast"],
           "broadcast_parameters is the library's own (course_lib.core.data_parallel): write "
           "it yourself, from dist.broadcast")
    expect(not summary["library_wrapper"],
           "the file uses the library's AllReducePerParameter, which is the answer itself: "
           "accumulate, sync and step yourself, with ring_all_reduce")
    for rank in range(n):
        if by_rank[rank]["broadcast_right"]:
            continue
        expect(not by_rank[rank]["broadcast_kept_own"],
               f"after broadcast_parameters rank {rank} still has its own starting weights: "
               "here every rank builds its model from another seed, so without a broadcast "
               "from rank 0 the replicas start apart and never agree")
        expect(False, f"after broadcast_parameters rank {rank}'s weights are not rank 0's: "
                      "copy rank 0's values into every parameter, in place")


def judge_syncs(summary: dict, k: int) -> None:
    """The ring calls of rank 0: once per step, after the last micro-batch, every gradient."""
    params = len(dp_step_cases.flat(dp_step_cases.make_model(0)))
    for number, step in enumerate(summary["steps"], start=1):
        expect(step["losses"] == k, f"step {number} computed {step['losses']} micro-batch "
                                    f"losses for {k} micro-batches: one loss_fn and one "
                                    "backward per micro-batch")
        if not step["syncs"]:
            expect("all_reduce" not in summary["collectives"],
                   "the gradients were averaged with dist.all_reduce: use ring_all_reduce, "
                   "your ring of exercise 6.3 (the line ring_all_reduce = mine_or_library(...))")
            expect(False, f"step {number} never called ring_all_reduce: the ranks' gradients "
                          "were not averaged, each rank stepped with its own")
        early = [losses for losses, _ in step["syncs"] if losses < k]
        first = early[0] if early else 0
        expect(not early, f"ring_all_reduce ran after micro-batch {first} of {k}: "
                          f"a sync on every micro-step sends {k} times the bytes for the same "
                          "result. Sync once per step, after the last micro-batch's backward")
        reduced = sum(numel for _, numel in step["syncs"])
        expect(reduced == params, f"step {number} all-reduced {reduced} numbers; the model has "
                                  f"{params} parameters: reduce every gradient exactly once")


SCALE_HINTS = {
    "n": "not divided by the world size: ring_all_reduce leaves the SUM of the ranks' "
         "gradients, and the step needs their mean",
    "k": "each micro-batch's loss is a mean; K backward passes add up K means, so the loss "
         "must be divided by the number of micro-batches",
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


def judge_dp_case(summary: dict, by_rank: dict, run) -> None:
    n, k = summary["ranks"], summary["accum_steps"]
    spec = {s["name"]: s for s in dp_step_cases.case_specs(n, {})}[summary["name"]]
    judge_broadcast(summary, by_rank, n)
    judge_syncs(summary, k)
    want = torch.tensor(dp_step_cases.reference_parameters(spec, n))
    got = torch.tensor(by_rank[0]["params"])
    if not torch.allclose(got, want, rtol=1e-9, atol=1e-12):
        name_scale_mistake(spec, n, got)
        gap = float((got - want).abs().max())
        expect(False, f"after {dp_step_cases.STEPS} steps rank 0's parameters differ from one "
                      f"process stepping on the whole batch (by up to {gap:.2e}): every step "
                      "must use the mean gradient of the whole global batch")
    for rank in range(1, n):
        expect(by_rank[rank]["params"] == by_rank[0]["params"],
               f"rank {rank}'s parameters are not rank 0's, bit for bit: every rank must take "
               "the same step, from the same averaged gradients")


@exercise("7.3", pointer=(
    "broadcast_parameters: for each parameter, dist.broadcast its tensor from rank 0 within "
    "the group, in place (under torch.no_grad()). data_parallel_step: zero the gradients; for "
    "each micro-batch, backward its loss divided by the number of micro-batches, with no "
    "communication inside that loop; after it, for each parameter, ring_all_reduce its .grad "
    "and divide by the group's size; then optimizer.step()."))
def my_dp_step(path: str = MY_DP_STEP_FILE, world_sizes=WORLD_SIZES) -> None:
    """``broadcast_parameters`` and ``data_parallel_step`` in the learner's file."""
    learner = find_learner_file(path, ("broadcast_parameters", "data_parallel_step"))
    check_file(learner, DP_STEP_CASES, {}, world_sizes, DP_STEP_ADVICE, judge_dp_case,
               deadline_s=dp_step_cases.DEADLINE_S)
    record_pass("7.3", path)
