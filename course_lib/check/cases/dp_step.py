"""Exercise 7.3, one data-parallel step: ``broadcast_parameters(model, group)`` and
``data_parallel_step(model, optimizer, micro_batches, loss_fn, group)`` in the learner's file.

Rank side: each rank builds a tiny float64 model from its OWN seed (only rank 0's is the model
to train), calls ``broadcast_parameters``, then takes a few optimizer steps: plain SGD, a mean
squared error, rank r's K micro-batches cut from the step's global batch as notebook 07 cuts
them (rank r owns block r). While a step runs, the learner's module-level ``ring_all_reduce``
is wrapped: every call notes how many micro-batch losses were computed so far, how many
numbers it reduced, whether it was handed a .grad, a parameter or another tensor, and whether
``optimizer.step()`` had run (averaging the weights after the step matches plain SGD only).
On 3 and 4 processes a case runs on a group of ranks [1, 2] or [1, 3],
whose rank 0 (the source of the broadcast) is not the world's.

Kernel side: the judge compares rank 0's parameters with one process taking the same steps on
the whole batch (``reference_parameters``, from the same seeds) and names a known mistake (a
factor in the gradient, the world's size for the group's, gradients kept from the step
before, a sync on every micro-step, a ring that summed copies of the gradients).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from course_lib.check.answers import close
from course_lib.check.cases import flat_parameters, members, with_group_case
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice
from course_lib.core import data_parallel

STEPS, MICRO_BATCH, LR = 2, 2, 0.1
CASES = (("1 micro-batch per step (K = 1)", 1), ("3 micro-batches per step (K = 3)", 3))


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": name, "accum_steps": k} for name, k in CASES]
    return with_group_case(specs, world_size, {"name": "K = 2", "accum_steps": 2})


def make_model(seed: int) -> nn.Module:
    """A 3 -> 4 -> 2 MLP in float64: 26 parameters in 4 tensors."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def global_batch(spec: dict, world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's N x K x B examples: x (rows, 3), y (rows, 2)."""
    rows = world_size * spec["accum_steps"] * MICRO_BATCH
    g = torch.Generator().manual_seed(1000 * spec["seed"] + step)
    return (torch.randn(rows, 3, generator=g, dtype=torch.float64),
            torch.randn(rows, 2, generator=g, dtype=torch.float64))


def micro_batches(spec: dict, world_size: int, rank: int, step: int) -> list:
    """Rank ``rank``'s K micro-batches: its contiguous block, cut in K."""
    x, y = global_batch(spec, world_size, step)
    k, b = spec["accum_steps"], MICRO_BATCH
    rows = [slice((rank * k + i) * b, (rank * k + i + 1) * b) for i in range(k)]  # B each
    return [(x[r], y[r]) for r in rows]


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def tensors(model: nn.Module) -> list[list[float]]:
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def reference_parameters(spec: dict, world_size: int, loss_scale: float = 1.0,
                         keep_grads: bool = False, last_micro_only: bool = False) -> list[float]:
    """One process, the whole batch each step, from rank 0's weights. A known mistake's
    result: the loss times ``loss_scale`` (not 1), ``keep_grads`` (.grad never zeroed), or
    ``last_micro_only`` (each rank's last micro-batch alone)."""
    model = make_model(100 * spec["seed"])
    for step in range(STEPS):
        if not keep_grads:
            model.zero_grad()
        batch = global_batch(spec, world_size, step)
        if last_micro_only:  # every rank's last micro-batch: (N * B, 3), (N * B, 2)
            last = [micro_batches(spec, world_size, r, step)[-1] for r in range(world_size)]
            batch = tuple(torch.cat(part) for part in zip(*last, strict=True))
        (mse(model, batch) * loss_scale).backward()
        with torch.no_grad():  # plain SGD's step, as torch.optim.SGD(lr=LR) takes it
            for p in model.parameters():
                p.add_(p.grad, alpha=-LR)
    return flat_parameters(model)


def handed(tensor, model: nn.Module) -> str:
    """What a tensor given to ring_all_reduce is: "gradient" (a .grad or a view of one),
    "parameter" (a parameter or a view of one), else "copy" (a new tensor)."""
    if not isinstance(tensor, torch.Tensor):
        return "copy"
    memory = tensor.untyped_storage().data_ptr()
    for kind, of in (("gradient", lambda p: p.grad), ("parameter", lambda p: p)):
        if any(of(p) is not None and of(p).untyped_storage().data_ptr() == memory
               for p in model.parameters()):
            return kind
    return "copy"


class SyncCounter:
    """Wraps the learner's ``ring_all_reduce`` for one step: per call, the micro-batch losses
    computed so far, the numbers reduced, what the tensor was (``handed``), whether
    ``optimizer.step()`` had run, and the learner's line."""

    def __init__(self, learner, model: nn.Module, optimizer, tracer: Tracer):
        self.learner, self.original = learner, getattr(learner, "ring_all_reduce", None)
        self.model, self.optimizer, self.tracer = model, optimizer, tracer
        self.losses, self.calls, self.stepped = 0, [], False

    def loss_fn(self, model, batch):
        self.losses += 1
        return mse(model, batch)

    def __enter__(self):
        self.step_hook = self.optimizer.register_step_post_hook(
            lambda *_: setattr(self, "stepped", True))
        if callable(self.original):
            def counted(tensor, *args, **kwargs):
                numel = tensor.numel() if isinstance(tensor, torch.Tensor) else 0
                self.calls.append({"losses": self.losses, "numel": numel,
                                   "handed": handed(tensor, self.model),
                                   "after_step": self.stepped,
                                   "line": self.tracer.learner_line()})
                return self.original(tensor, *args, **kwargs)

            self.learner.ring_all_reduce = counted
        return self

    def __exit__(self, *exc):
        self.step_hook.remove()
        if self.original is not None:
            self.learner.ring_all_reduce = self.original


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    model = make_model(100 * spec["seed"] + rank)  # every rank starts from other weights
    mine, rank0 = tensors(model), tensors(make_model(100 * spec["seed"]))
    steps = []
    with tracer.watching(spec["name"], members(spec)) as log:
        learner.broadcast_parameters(model, group)
        broadcast = sum(k for call, _, k in log.handed if call == "broadcast")
        after_broadcast = tensors(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            with SyncCounter(learner, model, optimizer, tracer) as counter:
                learner.data_parallel_step(model, optimizer,
                                           micro_batches(spec, n, rank, step),
                                           counter.loss_fn, group)
            steps.append({"losses": counter.losses, "syncs": counter.calls})
    return {"accum_steps": spec["accum_steps"], "broadcast_values": broadcast,
            "library_broadcast": learner.broadcast_parameters is
            data_parallel.broadcast_parameters,
            "broadcast_kept_own": after_broadcast == mine and mine != rank0,
            "broadcast_right": after_broadcast == rank0, "parameter_tensors": len(rank0),
            "broadcast_missed": [i for i, (a, b) in enumerate(zip(after_broadcast, rank0,
                                                                  strict=True)) if a != b],
            "steps": steps, "params": flat_parameters(model),
            **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

YOURSELF = "the exercise is to write it yourself"
TORCH_ALL_REDUCE = ("the gradients are averaged with torch's all_reduce: the exercise averages "
                    "them with ring_all_reduce, your ring of exercise 6.3 (the name the file "
                    "defines with mine_or_library)")
LIBRARY = {"course_lib.core.data_parallel": f"that is the library's own answer: {YOURSELF}",
           "torch.distributed.all_reduce": TORCH_ALL_REDUCE}
PARAMETERS = 26  # in the model above


def judge_broadcast(spec: dict, by_rank: dict, n: int) -> None:
    expect(not by_rank[0]["library_broadcast"], LIBRARY["course_lib.core.data_parallel"])
    for rank in range(n):
        mine = by_rank[rank]
        sent = mine["broadcast_values"]
        expect(sent <= PARAMETERS, f"broadcast_parameters broadcast {sent} values on rank "
                                   f"{rank} for a model of {PARAMETERS}: each parameter once")
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
        expect(rank != 0, f"{after} no longer holds its own starting weights in parameter "
                          f"tensor(s) {missed} (of {mine['parameter_tensors']}): rank 0's "
                          "weights are the ones every replica starts from, so they must come "
                          "out unchanged; a broadcast from rank 0 copies them to the others "
                          "and leaves rank 0's as they are")
        expect(False, f"{after} holds weights of its own in parameter tensor(s) {missed} (of "
                      f"{mine['parameter_tensors']}, in model.parameters() order): those were "
                      "not given rank 0's values")


def judge_syncs(summary: dict, k: int) -> None:
    """The ring calls of rank 0: once per step, after the last micro-batch, every gradient."""
    for number, step in enumerate(summary["steps"], start=1):
        expect(step["losses"] == k, f"step {number} computed {step['losses']} micro-batch "
                                    f"losses for {k} micro-batches: one loss_fn and one "
                                    "backward per micro-batch")
        if not step["syncs"]:
            expect("all_reduce" not in summary["collectives"], TORCH_ALL_REDUCE)
            expect(False, f"step {number} never called ring_all_reduce: the ranks' gradients "
                          "were not averaged, each rank stepped with its own")
        judge_after_step(step["syncs"])
        early = [call["losses"] for call in step["syncs"] if call["losses"] < k]
        expect(not early, f"ring_all_reduce ran after micro-batch {(early or [0])[0]} of {k}: "
                          f"a sync on every micro-step sends {k} times the bytes for the same "
                          "result, since the ranks' sum of the accumulated gradients is needed "
                          "once")
        reduced = sum(call["numel"] for call in step["syncs"])
        expect(reduced == PARAMETERS, f"step {number} all-reduced {reduced} numbers; the model "
                                      f"has {PARAMETERS} parameters: every gradient must be "
                                      "reduced exactly once")


def judge_after_step(syncs: list[dict]) -> None:
    """No ring_all_reduce after optimizer.step(): the step must use the averaged gradients."""
    late = next((call for call in syncs if call["after_step"]), None)
    if late is None:
        return
    where = f"line {late['line']}" if late["line"] else "outside your file"
    expect(late["handed"] != "parameter",
           f"ring_all_reduce ran on the parameters after optimizer.step() ({where}), not on "
           "the gradients before it: each rank stepped with its own gradient and the weights "
           "were averaged afterwards, which gives the same weights as averaging the "
           "gradients only for a step linear in the gradient, such as plain SGD's (not "
           "Adam's). Average every .grad over the ranks after the last micro-batch, then call "
           "optimizer.step()")
    expect(False, f"ring_all_reduce ran after optimizer.step() ({where}): the step had already "
                  "used gradients not averaged over the ranks. Average every .grad after the "
                  "last micro-batch, before optimizer.step()")


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


def name_step_mistake(spec: dict, by_rank: dict, world: int) -> None:
    """Rank 0's parameters are not the reference's: name a known cause, else the symptom
    (``world``: the processes launched, more than the case's ranks in a group case)."""
    n, k, got = len(by_rank), spec["accum_steps"], by_rank[0]["params"]
    expect(n == world or not close(got, reference_parameters(spec, n, n / world)),
           f"the gradients were divided by {world}, the size of the whole world, not by {n}, "
           "the size of the group you were given: dist.get_world_size() without the group "
           "counts every process")
    scales = [("n", n), ("k", k), ("nk", n * k)] if n != k else [("either", n), ("nk", n * k)]
    for key, scale in scales:
        if scale != 1 and not (key == "nk" and 1 in (n, k)):
            expect(not close(got, reference_parameters(spec, n, scale)),
                   f"the gradient is {scale} times too large: {SCALE_HINTS[key]}")
    twice = "the world size" if n != k else "the world size or by K"
    expect(n == 1 or not close(got, reference_parameters(spec, n, 1 / n)),
           f"the gradient is {n} times too small: it was divided by {twice} twice. The ring's "
           "sum divided once by the world size is the mean over the ranks; each micro-batch's "
           "loss divided once by K makes the K backward passes add up to one mean")
    expect(k == 1 or not close(got, reference_parameters(spec, n, 1 / k, last_micro_only=True)),
           "only each step's last micro-batch counted: .grad was emptied between micro-batches "
           "(zero_grad inside their loop), where backward must add up the K micro-batches' "
           "gradients; empty .grad once per step, before the first")
    expect(not close(got, reference_parameters(spec, n, keep_grads=True)),
           "step 2 used the gradients of step 1 as well: backward adds into .grad, and "
           "nothing emptied it between the steps")
    calls = [call for step in by_rank[0]["steps"] for call in step["syncs"]]
    weights = next((call for call in calls if call["handed"] == "parameter"), None)
    expect(weights is None, "ring_all_reduce was handed the parameters, not their gradients "
           f"(line {(weights or {}).get('line')}): the weights were averaged before the step, "
           "and each rank then stepped with its own gradient. Hand it each p.grad after the "
           "last micro-batch")
    in_place = any(call["handed"] == "gradient" for call in calls)
    apart = any(by_rank[r]["params"] != got for r in range(1, n))
    expect(in_place or not apart,
           "the tensors ring_all_reduce summed were not the gradients themselves (a copy or a "
           "new tensor), and nothing put the sums back into .grad: each rank stepped with its "
           "own gradient. The ring adds into the tensor it is handed, in place")
    gap = float((torch.tensor(got) - torch.tensor(reference_parameters(spec, n))).abs().max())
    expect(False, f"after {STEPS} steps rank 0's parameters differ from one process stepping "
                  f"on the whole batch (by up to {gap:.2e}): every step must use the mean "
                  "gradient of the whole global batch")


def judge(spec: dict, by_rank: dict, run) -> None:
    n = len(by_rank)
    judge_broadcast(spec, by_rank, n)
    judge_syncs(by_rank[0], spec["accum_steps"])
    if not close(by_rank[0]["params"], reference_parameters(spec, n)):
        name_step_mistake(spec, by_rank, run.world_size)
    for rank in range(1, n):
        expect(by_rank[rank]["params"] == by_rank[0]["params"],
               f"rank {rank}'s parameters are not rank 0's, bit for bit: every rank must take "
               "the same step, from the same averaged gradients")


EXERCISE = FileExercise(
    "7.3", "workspace/my_dp_step.py", ("broadcast_parameters", "data_parallel_step"),
    __name__, Advice.unpaired("every rank must call ring_all_reduce on the same gradients, in "
                              "the same order, once per step", "all-reduces", "all-reduced"),
    judge, library=LIBRARY, deadline_s=60.0, entry="check.nb07.my_dp_step")
