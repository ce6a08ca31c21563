"""Exercise 10.7, ZeRO-3's moments for one wrapped module: ``unshard(unit)``, ``reshard(unit)``
and ``reduce_grad(unit)`` in the learner's file, inside the course's ``fully_shard``.

Rank side: each case builds the same small float64 model on every rank (a first layer, two
residual blocks, a last layer), wraps the blocks and then the root with ``shard_module``, whose
``FlatShard`` calls the learner's functions at its moments: before the module computes (in
forward, and again in backward), after forward, and when backward has left the module's whole
gradient in ``unit.full.grad``. Right after each call the case looks at what the call left
(memory behind ``unit.full``, every rank's place in it, ``unit.full.grad``, ``unit.shard.grad``,
the bytes it sent) and stops with a ``CaseFinding`` that says what is wrong. A gather started
with ``async_op=True`` is waited on first if its handle is in ``unit.pending``, as the module
waits before it computes; one whose handle was kept nowhere and never waited on is a finding.
Each rank trains on its own batches with SGD with momentum over the shards. On 3 and 4
processes a case runs on a group of ranks [1, 2] or [1, 3].

Kernel side: ``reference`` is plain data parallelism (the mean gradient, an unsharded model).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.check.answers import close
from course_lib.check.cases import SUMMED, global_rank_sentence, members, rank_name, with_group_case
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.learner import CaseFinding
from course_lib.check.mp.tracer import ALL_REDUCES, Tracer
from course_lib.check.mp.verdict import Advice, is_shape_error
from course_lib.core.flat_shard import FlatShard, parameter_places
from course_lib.core.fully_shard import shard_module

FEATURES, WIDTH, CLASSES, BATCH = 4, 6, 3, 5
LR, MOMENTUM = 0.1, 0.9


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.layer(h))


class Net(nn.Module):
    """``twice``: block 0 computes again after block 1 (a module used twice in forward)."""

    def __init__(self, twice: bool):
        super().__init__()
        self.first, self.last = nn.Linear(FEATURES, WIDTH), nn.Linear(WIDTH, CLASSES)
        self.blocks, self.twice = nn.ModuleList([Block(), Block()]), twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[1](self.blocks[0](torch.tanh(self.first(x))))
        return self.last(self.blocks[0](h) if self.twice else h)


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": "2 steps, two blocks and the root", "steps": 2, "accum": 1},
             {"name": "2 steps, block 0 used twice in forward", "twice": True, "steps": 2,
              "accum": 1},
             {"name": "1 step of 2 backward passes (accumulation)", "steps": 1, "accum": 2}]
    group_case = {"name": "1 step, two blocks and the root", "steps": 1, "accum": 1}
    return [{"twice": False, **spec} for spec in with_group_case(specs, world_size, group_case)]


def make_model(spec: dict) -> Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        return Net(spec["twice"]).double()


def batch(spec: dict, rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * spec["seed"] + 100 * step + 10 * micro + rank)
    return (torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def reference(spec: dict, ranks: int, grad_scale: float = 1.0) -> tuple[list, dict]:
    """Plain data parallelism on ``ranks`` ranks: each step's loss on each rank, and the
    parameters at the end (``grad_scale`` N: stepped with the sum of the ranks' gradients)."""
    model = make_model(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []  # losses[step * accum + micro][rank]
    for step in range(spec["steps"]):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(spec["accum"]):
            mine = [F.cross_entropy(model(x), y) for x, y in
                    (batch(spec, rank, step, micro) for rank in range(ranks))]
            (sum(mine) * grad_scale / ranks / spec["accum"]).backward()  # the mean
            losses.append([loss.item() for loss in mine])
        optimizer.step()
    return losses, {k: v.detach().tolist() for k, v in model.named_parameters()}


def bytes_of(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return close(a, b, 0, 0)


class LearnerShard(FlatShard):
    """A flat shard whose gather, free and reduce-scatter are the learner's functions."""

    learner = log = name = None  # the learner's module, the case's CaseLog, the module's name
    stepped = False  # True after the case's first optimizer step
    moment = "before its forward"  # when FlatShard calls unshard: forward, or backward

    def __init__(self, module: nn.Module, *args, **kwargs):
        first = torch.cat([p.detach().reshape(-1) for p in parameter_places(module)])
        super().__init__(module, *args, **kwargs)
        self.first = first  # every value as every rank starts: what the first gathers give
        self.made = self.full, self.full.untyped_storage()._cdata  # the tensor and its memory

    def reshard(self) -> None:
        if self.name is None:  # FlatShard.__init__: the unit starts without memory
            return super().reshard()
        self.learner.reshard(self)
        self.expect_freed("reshard", "after its forward, reshard(unit)", "the parameters are "
                          "whole only while the module computes")
        return None

    def unshard(self, async_op: bool = False) -> None:
        was_whole, before = bytes_of(self.full) > 0, self.sent()
        started = len(self.log.started)
        self.learner.unshard(self)
        self.expect_waited(self.log.started[started:])
        self.wait_for_unshard()  # a gather left in unit.pending: the module waits for it
        self.expect_same_tensor("unshard")
        sent = [a - b for a, b in zip(self.sent(), before, strict=True)]
        if was_whole and any(sent):
            raise CaseFinding(f"unshard(unit) for {self.name} gathered again while unit.full "
                              "was whole already (a module used twice, its second use): "
                              "messages sent for nothing")
        self.expect_share(sent[0], "unshard", "an all-gather")
        whole = self.full.numel() * self.full.element_size()
        if bytes_of(self.full) != whole:
            raise CaseFinding(f"after unshard(unit) for {self.name} {self.moment}, unit.full "
                              f"has {bytes_of(self.full)} bytes of memory: its "
                              f"{self.full.numel()} values need {whole}")
        self.expect_shards()

    def expect_waited(self, started: list) -> None:
        """A gather started with async_op=True is waited on in unshard, or its handle kept in
        unit.pending, where the module waits for it before it computes."""
        for handle in started:
            if not handle.done and handle is not self.pending:
                raise CaseFinding(
                    f"after unshard(unit) for {self.name}, your gather had not finished when "
                    "unshard returned: wait on it, or keep its handle in unit.pending, where "
                    f"the module waits before it computes ({handle.kind} with async_op=True "
                    f"at line {handle.line}, its handle kept nowhere)")

    def before_forward(self) -> None:
        self.moment = "before its forward"
        super().before_forward()

    def before_backward(self) -> None:
        self.moment = "before its backward"
        super().before_backward()

    def sent(self) -> tuple[int, int]:
        """Bytes and calls the learner's code sent so far in this case."""
        log = self.log
        return log.bytes_sent, len(log.collectives) + len(log.library) + log.messages

    def expect_share(self, sent: int, call: str, what: str) -> None:
        """A gather or a reduce-scatter sends (N-1)/N of unit.full from every rank."""
        share = self.full.numel() * self.full.element_size() * (self.world_size - 1) // \
            self.world_size
        if sent > share:
            raise CaseFinding(f"{call}(unit) for {self.name} sent {sent} bytes from rank "
                              f"{self.rank}: {what} sends (N-1)/N of the module's "
                              f"{self.full.numel()} values, {share} bytes on "
                              f"{self.world_size} ranks" + ("; an all-reduce twice that"
                                                           if call == "reduce_grad" else ""))

    def expect_shards(self) -> None:
        """Every rank's place holds its shard: all of them before the first step (the values
        every rank starts from), this rank's own after it."""
        r, s, full = self.rank, self.shard_numel, self.full.detach()
        for k in range(self.world_size) if not self.stepped else ():
            want = self.first[k * s:(k + 1) * s].to(full.dtype)
            if not same(full[k * s:k * s + want.numel()], want):
                raise CaseFinding(f"after unshard(unit) for {self.name}, values "
                                  f"{k * s}..{k * s + want.numel() - 1} of unit.full on "
                                  f"rank {r} are not rank {k}'s shard")
        if not same(full[r * s:(r + 1) * s], self.shard.detach().to(full.dtype)):
            raise CaseFinding(f"after unshard(unit) for {self.name}, rank {r}'s own place in "
                              f"unit.full (values {r * s}..{(r + 1) * s - 1}) does not hold "
                              "its shard")

    def reduce_grad(self, full: torch.Tensor) -> None:
        log, whole_grad = self.log, self.full.grad
        sent, before = log.bytes_sent, (len(log.collectives), len(log.library))
        self.learner.reduce_grad(self)
        reduced = sorted(ALL_REDUCES & {*log.collectives[before[0]:], *log.library[before[1]:]})
        if reduced:
            raise CaseFinding(f"reduce_grad(unit) for {self.name} all-reduces the gradient "
                              f"({reduced[0]}): every rank receives the sum of every chunk "
                              "and keeps one; a reduce-scatter hands each rank only its own "
                              "chunk's sum, half the bytes")
        self.expect_share(self.log.bytes_sent - sent, "reduce_grad", "a reduce-scatter")
        got = self.shard.grad
        if got is not None and got.untyped_storage().data_ptr() == \
                whole_grad.untyped_storage().data_ptr():
            raise CaseFinding(f"after reduce_grad(unit) for {self.name}, unit.shard.grad "
                              "shares its memory with the module's whole gradient: all "
                              f"{whole_grad.numel()} values stay alive as long as it does")
        if self.full.grad is not None:
            raise CaseFinding(f"after reduce_grad(unit) for {self.name}, unit.full.grad still "
                              f"holds this rank's whole gradient ({bytes_of(self.full.grad)} "
                              "bytes): once reduced, nothing needs it")
        self.expect_freed("reduce_grad", "after reduce_grad(unit)", "backward is done with the "
                          "parameters until the next forward")
        if self.shard.grad is None:
            raise CaseFinding(f"after reduce_grad(unit) for {self.name}, unit.shard.grad is "
                              "None: the mean of this rank's chunk goes there, for the "
                              "optimizer to step")

    def expect_same_tensor(self, after: str) -> None:
        if self.full is not self.made[0]:
            raise CaseFinding(f"{after}(unit) for {self.name} put a new tensor in unit.full: "
                              "the module's parameters are views of the one the unit made, and "
                              "its gradient arrives there")
        if self.full.untyped_storage()._cdata != self.made[1]:
            raise CaseFinding(f"{after}(unit) for {self.name} gave unit.full other memory: the "
                              "views autograd saved for backward keep the old memory, and all "
                              "its values, alive")

    def expect_freed(self, call: str, when: str, why: str) -> None:
        self.expect_same_tensor(call)
        if bytes_of(self.full) > 0:
            raise CaseFinding(f"{when} for {self.name}, unit.full still holds "
                              f"{bytes_of(self.full)} bytes: {why}")


def wrap(model: Net, learner, group, log) -> None:
    LearnerShard.learner, LearnerShard.log, LearnerShard.stepped = learner, log, False
    for i, block in enumerate(model.blocks):
        shard_module(block, LearnerShard, group, True, None)
        block.shard_state.name = f"blocks.{i}"
    shard_module(model, LearnerShard, group, True, None)
    model.shard_state.name = "the root"


def backward(loss: torch.Tensor) -> None:
    try:
        loss.backward()
    except RuntimeError as e:
        if "inplace" not in str(e):  # "modified by an inplace operation", "... modified inplace"
            raise
        raise CaseFinding("backward could not use the parameters it saved in forward: the "
                          "gather before backward wrote into unit.full as autograd sees it "
                          "(each in-place write is a new version of the tensor), and autograd "
                          "refuses views saved from an older version") from None


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    rank = dist.get_rank(group)
    model = make_model(spec)
    losses = []
    with tracer.watching(spec["name"], members(spec)) as log:
        wrap(model, learner, group, log)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        for step in range(spec["steps"]):
            for micro in range(spec["accum"]):
                x, y = batch(spec, rank, step, micro)
                loss = F.cross_entropy(model(x), y)
                backward(loss / spec["accum"])  # the mean over the micro-steps
                losses.append(loss.item())
            model.finish_gradient_sync()
            optimizer.step()
            optimizer.zero_grad()
            LearnerShard.stepped = True
    return {"losses": losses,
            "params": {k: v.tolist() for k, v in model.full_state_dict().items()}}


# ---- the judge (in the kernel) --------------------------------------------------------------

def judge_loss(got: float, want: float, who: str, forward: int) -> None:
    expect(math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12),
           f"{who}'s loss in forward {forward + 1} is {got:.6f}, plain data parallelism's "
           f"{want:.6f}: " + ("the first forward computed with other numbers than the model's, "
                              "so the gathered parameters are not every rank's shard, each in "
                              "its place" if forward == 0 else
                              "the parameters it computed with were not the same"))


def judge(spec: dict, by_rank: dict, run) -> None:
    """The first forward's losses, then the parameters after the steps, then every loss."""
    n = len(by_rank)
    losses, params = reference(spec, n)
    for rank in range(n):
        judge_loss(by_rank[rank]["losses"][0], losses[0][rank], rank_name(by_rank, rank), 0)
    for rank in range(n):
        who, got = rank_name(by_rank, rank), by_rank[rank]["params"]
        wrong = [k for k in params if not close(got[k], params[k])]
        summed = reference(spec, n, grad_scale=n)[1]
        expect(not wrong or any(not close(got[k], summed[k]) for k in summed),
               f"the steps used {SUMMED}")
        expect(not wrong or spec["accum"] == 1,
               f"after {spec['accum']} backward passes and one step, {who}'s "
               f"{', '.join(wrong[:1])} differs from plain data parallelism's: each backward "
               "calls reduce_grad once, "
               "and what an earlier one left in unit.shard.grad must stay in the sum")
        expect(not wrong, f"after {spec['steps']} steps, {who}'s {', '.join(wrong[:1])} "
                          "differs from plain data parallelism's, though the first forward "
                          "was right: look at the gradient each shard gets")
        for i in range(1, len(losses)):
            judge_loss(by_rank[rank]["losses"][i], losses[i][rank], who, i)


def explain(error: dict, text: str) -> str:
    message = error["message"]
    if "for storage of size 0" in message:  # a write into unit.full with no memory behind it
        return ("unit.full had no memory there: reshard gave its storage back (0 bytes), and "
                "the tensor and its views stay without any. unshard must give the storage its "
                "bytes again, unit.full.untyped_storage() resized to the size of N*s values, "
                "before anything, the gather included, writes into it.")
    if not is_shape_error(message):
        return ""
    return global_rank_sentence(error, text) or (
        "unit.shard holds s values, this rank's shard: its gradient has that shape, and the "
        "module's whole gradient, N*s values, does not fit it." if "gradient" in message
        else "")


EXERCISE = FileExercise(
    "10.7", "workspace/my_flat_shard.py", ("unshard", "reshard", "reduce_grad"), __name__,
    Advice.unpaired("every rank must gather and reduce-scatter each module at the same "
                    "moments, with the unit's own group", calls="collectives"), judge,
    library=dict.fromkeys(("course_lib.core.flat_shard", "course_lib.core.fully_shard"),
                          "that is the course's own fully_shard: write the three moments "
                          "yourself, from the ring's two halves"),
    explain=explain, deadline_s=60.0, entry="check.nb10b.my_flat_shard")
