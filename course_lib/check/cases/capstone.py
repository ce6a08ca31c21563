"""Exercise 11.1, the capstone's trainer: ``same_start``, ``train_step`` and ``epoch_orders`` in
the learner's file, launched on 2 processes and judged rung by rung of the equivalence ladder.

Rank side: each case runs the learner's functions and, on the same rank, the reference they
must equal: one big batch through an unwrapped copy of the model, on one process, in float64.
Nothing of the reference needs a message, so a learner's missing collective cannot hide it.

    one micro-step        1 process, 1 micro-step: train_step against the big batch
    K micro-steps         1 process, 4 micro-steps
    N processes           every process, 2 micro-steps each: gradients, syncs, weights, loss
    epochs                epoch_orders over 3 epochs: who gets which example, when
    same start            weights from another seed on each rank, then same_start (last: a
                          rank that skips a collective leaves its peer waiting)

Kernel side: ``check`` climbs ``RUNGS``; the report names the first rung that fails.
"""

from __future__ import annotations

import copy
import hashlib
import linecache
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from course_lib.check.checker import AS_GIVEN, ExerciseError, expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.runner import run_file
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice, raise_if_stopped
from course_lib.check.own_work import expect_own_file
from course_lib.check.reference import given_file
from course_lib.core.accumulation import count_target_tokens, sum_token_loss
from course_lib.runtime.workspace import record_pass
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import TransformerConfig, make_transformer
from course_lib.tasks.sequences import VOCAB, global_batch, input_length

GLOBAL_BATCH, MAX_DIGITS = 8, 3  # examples per optimizer step: sums of 1 to 3 digits
LR = 0.1  # plain SGD: the new weights are a linear function of the gradient
DATASET_SIZE, EPOCHS = 10, 3  # examples epoch_orders shares out (uneven on 3 or 4 ranks)
CASES = (("one micro-step", 1, 1), ("K micro-steps", 1, 4), ("N processes", None, 2))
CLOSE = 1e-9  # float64: a right answer is off by rounding only


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": name, "accum_steps": accum, **({"members": [0]} if ranks else {})}
             for name, ranks, accum in CASES]
    return specs + [{"name": "epochs"}, {"name": "same start"}]


def small_model(seed: int) -> torch.nn.Module:
    """A tiny transformer for the sums task, in float64 so that equal means equal."""
    shape = TransformerConfig(len(VOCAB), input_length(MAX_DIGITS), 16, 2, 1, 0.0)
    return make_transformer(shape, seed=seed).double()


def weights_digest(module: torch.nn.Module) -> str:
    """A fingerprint of every weight, bit for bit."""
    h = hashlib.sha256()
    for tensor in module.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def mean_token_loss(model, batch) -> torch.Tensor:
    return sum_token_loss(model(batch.inputs), batch.targets) / count_target_tokens(
        batch.targets)


def run_step_case(learner, spec: dict, group, tracer: Tracer) -> dict:
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    module = small_model(seed=0)  # the same weights on every rank
    reference = copy.deepcopy(module)
    batch = global_batch(seed=0, step=0, size=GLOBAL_BATCH, max_digits=MAX_DIGITS)
    ref_loss = mean_token_loss(reference, batch)  # the big batch: the mean over its tokens
    ref_loss.backward()
    mine = micro_batches_of_rank(batch, rank, world_size, spec["accum_steps"])
    with torch.no_grad():  # the mean of micro-batch means (what a loss log must NOT be)
        hinted = float(torch.stack([mean_token_loss(reference, mb) for mb in mine]).mean())
    model, syncs = DistributedDataParallel(module, process_group=group), [0]

    def counting_hook(state, bucket):  # DDP calls it once per bucket it all-reduces
        syncs[0] += 1
        return allreduce_hook(group, bucket)

    model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with tracer.watching(spec["name"], range(world_size)):
        loss = learner.train_step(model, optimizer, mine, group)
    grads, error, ratio = [p.grad for p in module.parameters()], None, None
    if not any(g is None for g in grads):
        got = torch.cat([g.flatten() for g in grads])
        want = torch.cat([p.grad.flatten() for p in reference.parameters()])
        error, ratio = float((got - want).abs().max() / want.abs().max()), float(
            got.norm() / want.norm())
    return {"accum_steps": spec["accum_steps"], "ranks": world_size, "grad_error": error,
            "grad_ratio": ratio, "syncs": syncs[0], "ref_loss": float(ref_loss),
            "loss": float(loss) if isinstance(loss, (int, float, torch.Tensor)) else None,
            "micro_mean_loss": hinted, "digest": weights_digest(module)}


def run_case(learner, spec: dict, group, tracer: Tracer, options: dict) -> dict:
    ranks = range(dist.get_world_size(group))
    if spec["name"] == "epochs":
        with tracer.watching(spec["name"], ranks):
            orders = learner.epoch_orders(range(DATASET_SIZE), EPOCHS, group)
        return {"orders": [[int(i) for i in order] for order in orders]}
    if spec["name"] == "same start":
        module = small_model(seed=100 + dist.get_rank(group))  # each rank its own weights
        with tracer.watching(spec["name"], ranks):
            learner.same_start(module, group)
        return {"digest": weights_digest(module), "rank0": weights_digest(small_model(100))}
    return run_step_case(learner, spec, group, tracer)


# ---- the judge (in the kernel): the ladder -----------------------------------------------------

def judge_step(s: dict) -> None:
    k, ratio, n = s["accum_steps"], s["grad_ratio"], s["ranks"]
    if ratio is None:
        hint = "some parameters have no gradient after train_step: does backward run?"
    elif n > 1 and s["syncs"] == 0:
        hint = (f"the ranks' gradients were never all-reduced: there is no all-reduce in the "
                f"step, so each of the {n} ranks kept the gradient of its own micro-batches. "
                "DDP syncs only in a backward outside no_sync(): on the last micro-step")
    elif n == 1 and k > 1 and abs(ratio - k) < 0.2 * k:
        hint = (f"with {k} micro-steps the gradient is about {k} times the big batch's: each "
                "backward adds its micro-step's whole gradient into .grad. What should each "
                "micro-step's loss be a share of?")
    elif n > 1 and abs(ratio * n - 1) < 0.2:
        hint = (f"on {n} processes the gradient is {n} times too small: DDP averages the "
                "ranks' gradients; what does that do to your scaling?")
    else:
        hint = (f"the gradient is off by up to {s['grad_error']:.1%} of its largest entry, "
                "with the same examples: micro-batches hold different numbers of scored "
                "tokens. What is each micro-step's token sum divided by?")
    expect(s["grad_error"] is not None and s["grad_error"] < CLOSE, hint)


def judge_step_everywhere(results: dict) -> None:
    for s in results["N processes"].values():
        judge_step(s)


def judge_syncs(results: dict) -> None:
    for rank, s in sorted(results["N processes"].items()):
        expect(s["syncs"] == 1,
               f"rank {rank} all-reduced its gradients {s['syncs']} times in one optimizer "
               f"step of {s['accum_steps']} micro-steps (the values are right, the time is "
               "not). DDP decides in forward whether the coming backward syncs: look at what "
               "no_sync() wraps")


def judge_replicas(results: dict) -> None:
    expect(len({s["digest"] for s in results["N processes"].values()}) == 1,
           "after one step the ranks hold different weights: every rank must apply the same "
           "gradient to the same weights")
    for rank, s in sorted(results["same start"].items()):
        expect(s["digest"] == s["rank0"], f"after same_start rank {rank} does not hold rank "
                                          "0's weights: does every tensor of the model reach "
                                          "every rank?")


def judge_loss(results: dict) -> None:
    by_rank = results["N processes"]
    losses = {rank: s["loss"] for rank, s in by_rank.items()}
    expect(None not in losses.values(), "train_step must return the step's loss, a number")
    expect(len(set(losses.values())) == 1,
           f"the ranks logged different losses {sorted(losses.values())}: each rank sees "
           "only its share of the batch")
    ref, got = by_rank[0]["ref_loss"], losses[0]
    micro = sum(s["micro_mean_loss"] for s in by_rank.values()) / len(by_rank)
    expect(abs(got - micro) > CLOSE or abs(micro - ref) < CLOSE,
           f"the logged loss {got:.4f} is the mean of the micro-batches' means; the global "
           f"batch's loss is {ref:.4f}: its micro-batches hold different numbers of tokens")
    expect(abs(got - ref) < CLOSE, f"the logged loss {got:.4f} is not the global batch's "
                                   f"mean over its scored tokens, {ref:.4f}")


def judge_epochs(results: dict) -> None:
    orders = {rank: s["orders"] for rank, s in sorted(results["epochs"].items())}
    first = orders[0]
    expect(len(first) >= 2 and first[0] != first[1],
           f"rank 0 gets the same examples in the same order in epoch 0 and epoch 1: "
           f"{first[0][:5]}...: what makes the sampler shuffle differently in the next epoch?")
    share = -(-DATASET_SIZE // len(orders))  # what DistributedSampler gives each rank
    for epoch in range(len(first)):
        seen = [i for rank in orders for i in orders[rank][epoch]]
        mine = [orders[rank][epoch] for rank in orders]
        expect(set(seen) == set(range(DATASET_SIZE)) or any(len(m) != share for m in mine)
               or len({tuple(m) for m in mine}) == 1,
               f"in epoch {epoch} the ranks together skip examples, though each took its "
               f"share ({share} of {DATASET_SIZE}): each rank shuffled differently, and took "
               "its share of its own order. The sampler's seed must be the same on every rank")
        expect(set(seen) == set(range(DATASET_SIZE)),
               f"in epoch {epoch} the ranks together skip examples: a sampler per rank must "
               "know its rank and the world size")
        expect(len(seen) - len(set(seen)) < len(orders),
               f"in epoch {epoch} the ranks train on the same examples: a sampler per rank "
               "must know its rank and the world size")


RUNGS = (  # (the cases it reads, what it claims), in the order they are climbed
    (("one micro-step",), "one micro-step on one process = one big batch"),
    (("K micro-steps",), "K micro-steps on one process = one big batch"),
    (("N processes",), "N processes x K micro-steps = one big batch"),
    (("N processes",), "the gradients are synced once per optimizer step"),
    (("N processes", "same start"), "every replica holds the same weights, bit for bit"),
    (("N processes",), "the logged loss is the global batch's, on every rank"),
    (("epochs",), "each epoch a new order, every example once, on no two ranks"),
)
JUDGES = (lambda r: judge_step(r["one micro-step"][0]),
          lambda r: judge_step(r["K micro-steps"][0]), judge_step_everywhere, judge_syncs,
          judge_replicas, judge_loss, judge_epochs)  # one per rung


def rung_report(number: int, hint: str) -> str:
    end = "." if hint[-1:].isalnum() else ""  # a sentence ends; a "?" or a report stays
    return (f"rung {number} of {len(RUNGS)} fails: {RUNGS[number - 1][1]}. "
            f"{hint[:1].upper()}{hint[1:]}{end}")


def waiting_rank(run, path: str) -> str:
    """A rank left waiting in a collective that a peer never called (the peer went on), or
    every rank waiting in one they called with different roots; "" when the launch ended
    otherwise. ``path``: the learner's file, where the line is read when the error has none."""
    if any(r.error and r.error["kind"] == "learner" for r in run.ranks):
        return ""
    for r in run.ranks:
        e = r.error or {}
        if e.get("kind") in ("peer_gone", "timeout") and e.get("line"):
            code = (e["source"] or linecache.getline(path, e["line"])).split("#")[0].strip()
            at = f"line {e['line']}, {code}" if code else f"line {e['line']}"
            statuses = {o.rank: (o.error or {}).get("status") or {} for o in run.ranks}
            mine = statuses[r.rank]
            joined = all(s.get("op") == mine.get("op") and s.get("collectives") ==
                         mine.get("collectives") for s in statuses.values())
            roots = {rank: s.get("root") for rank, s in statuses.items()}
            if joined and len(set(roots.values())) > 1:  # the same call, other roots
                called = ", ".join(f"rank {rank} with {root}" for rank, root in roots.items())
                word = str(roots[r.rank]).split("=")[0]  # src, dst, group_src, ...
                return (f"every rank waited at {at}: each called it, but with another root "
                        f"({called}). A collective with a root pairs up only when every rank "
                        f"of the group names the same one: {word}=0 on every rank" +
                        (", so that rank 0 sends and the others receive"
                         if mine.get("op") == "broadcast" else ""))
            others = ", ".join(str(o.rank) for o in run.ranks if o.rank != r.rank)
            return (f"rank {r.rank} waited at {at}, and rank {others} never joined it: a "
                    "collective completes only when every rank of the group calls it")
    return ""


def check(exercise: FileExercise, path: str, world_sizes=(2,)) -> None:
    """Launch, climb the ladder, print each rung passed; raise at the first that fails."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if 'NotImplementedError("Exercise 11.1' in text:  # a student copy's file, left open
        raise NotImplementedError(path)
    if text.strip() == (given_file(os.path.basename(path)) or "").strip():  # untouched
        raise NotImplementedError(AS_GIVEN)
    learner = find_learner_file(path, exercise.functions)
    expect_own_file(path, exercise.library, path)
    run = run_file(exercise.cases, learner, world_sizes[0], deadline_s=60)
    results = {s["name"]: by_rank for s, by_rank in run.finished_cases()}
    for number, ((cases, claim), judge) in enumerate(zip(RUNGS, JUDGES, strict=True), 1):
        if any(case not in results for case in cases):  # did not finish: how the launch ended
            hint = waiting_rank(run, learner.path)
            try:
                hint = hint or raise_if_stopped(run, learner, exercise.advice) or ""
            except ExerciseError as e:
                hint = e.hint
            raise ExerciseError(rung_report(number, hint)) if hint else RuntimeError(
                f"the checker itself failed; please report this: {run.launch_error}")
        try:
            judge(results)
        except ExerciseError as e:
            raise ExerciseError(rung_report(number, e.hint)) from None
        print(f"rung {number}: {claim}")
    record_pass(exercise.id, path)


SAME = "every rank must call the same collectives in the same order."
EXERCISE = FileExercise(
    "11.1", "workspace/capstone_trainer.py", ("same_start", "train_step", "epoch_orders"),
    __name__, Advice(all_send=SAME, all_recv=SAME, mismatch=SAME, size=SAME), None,
    library=dict.fromkeys(("course_lib.train", "course_lib.core.train_step"), "that is the "
                          "course's own trainer: fix the step in this file"),
    entry="check.nb11.capstone_trainer")
