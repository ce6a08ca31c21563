"""Each file exercise in one module: what every rank runs, and how the kernel judges it.

A module here is what ``course_lib.check.mp``'s program runs in every rank and what the
exercise's checker (a few lines in ``course_lib.check.nbNN``) hands to
``mp.harness.check_exercise``. It holds, for one exercise (two for the token ring):

    case_specs(world_size, options) -> [{"name": ..., "members": [global ranks], ...}, ...]
    run_case(learner_module, spec, group, tracer, options) -> a JSON summary (rank side)
    judge(spec, by_rank, run) -> notes or None; raises ExerciseError (kernel side)
    EXERCISE = FileExercise(...)  # its file, functions, advice, library it refuses, ...

``members`` (absent: every rank) names the ranks of a case that runs on a group, such as
``subgroup(3)``, ranks [1, 2]: there a rank's number in the group is not its global one. The
modules: ``token_ring`` (5.3, 5.4), ``ring`` with ``ring_mistakes`` (6.3: a ring simulated
step by step to name a learner's mistake), ``dp_step`` (7.3), ``hooks`` with
``all_reduce_log`` (8.3), ``ddp_script`` (9.3), ``zero1`` (10.4), ``bf16_hook`` (10.5),
``zero2`` (10.6), ``shard_unit`` (10.7), ``capstone`` (11.1). A case that finds the
learner's code left what it cannot go on with raises ``course_lib.check.mp.learner.CaseFinding``:
its message is the verdict.
"""

from __future__ import annotations

import ast
import re

import torch
import torch.distributed as dist

from course_lib.check.checker import expect
from course_lib.check.own_work import code_scope

OPTIMIZERS = {"SGD with momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "AdamW": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01})}
SUMMED = ("the SUM of the ranks' gradients: the reduce-scatter adds them up, and plain data "
          "parallelism steps with their mean")  # "the step used " + SUMMED


def members(spec: dict) -> list[int]:
    """The global ranks of a case (every rank when its spec names none)."""
    return list(spec.get("members", range(dist.get_world_size())))


def passed(spec: dict, group):
    """The group a case hands the learner: None, the default group, when it runs on every
    rank; else the case's own group."""
    return group if "members" in spec else None


def subgroup(world_size: int) -> list[int]:
    """The ranks of a case that runs on a group smaller than the world, not from rank 0 on:
    [1] of 2 processes, [1, 2] of 3, [1, 3] of 4."""
    return [1] if world_size == 2 else [1, world_size - 1]


def with_group_case(specs: list[dict], world_size: int, case: dict) -> list[dict]:
    """``specs``, then on 3 and 4 processes ``case`` on the group ``subgroup`` names (its name
    ends ", in a group of ranks [1, 2]"); each spec numbered by its seed."""
    if world_size >= 3:
        ranks = subgroup(world_size)
        specs = [*specs, {**case, "name": f"{case['name']}, in a group of ranks {ranks}",
                          "members": ranks}]
    return [{**spec, "seed": i} for i, spec in enumerate(specs)]


def flat_parameters(model: torch.nn.Module) -> list[float]:
    """Every parameter's values, in ``model.parameters()`` order."""
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).tolist()


def expect_waited(rank: int, s: dict, why: str) -> None:
    """Every isend and irecv handle of the rank waited on, no isend's tensor changed before
    its wait, nothing sent before the irecv that brings it was waited on (``s``: the tracer's
    summary of the case)."""
    for handle in s["unwaited"]:
        way = "to" if handle["kind"] == "isend" else "from"
        expect(False, f"rank {rank} returned without waiting for its {handle['kind']} {way} "
                      f"rank {handle['peer']} (line {handle['line']}): {why}")
    for sent in s["forwarded"]:
        expect(False, f"rank {rank} sent, at line {sent['line']}, values that its irecv from "
                      f"rank {sent['peer']} (line {sent['recv_line']}) had not finished "
                      "receiving: that irecv was not waited on yet, so what went out may be "
                      "old values or half of each. Wait on a receive before you send what it "
                      "brings")
    for handle in s["touched"]:
        expect(False, f"rank {rank} changed the tensor of its isend to rank {handle['peer']} "
                      f"(line {handle['line']}) before that isend's wait() returned: the "
                      "message may still be reading it, so the other rank can get the new "
                      "values, the old ones or some of each. Change a tensor you send only "
                      "after its wait()")


def fail_with_gap(got: list, want: list, who: str, step: int) -> None:
    """Fail, saying by how much ``who``'s parameters after ``step`` (from 0) are off."""
    gap = float((torch.as_tensor(got) - torch.as_tensor(want)).abs().max())
    expect(False, f"after step {step + 1}, {who}'s parameters differ from plain data "
                  f"parallelism by up to {gap:.2e}")


def ring_share(sent: list[int], numel: int, element_size: int, phases: int) -> str | None:
    """What is wrong with the bytes each rank sent (``sent``) for ``phases`` halves of a ring
    on a tensor of ``numel`` values, or None: each half sends (N-1)/N of the tensor from every
    rank, give or take one chunk, however the chunks are cut."""
    n, nbytes = len(sent), numel * element_size
    whole = phases * (n - 1) * nbytes  # the whole tensor in each of the steps
    share = whole / n  # one chunk per step: the bandwidth-optimal share
    chunk = -(-numel // n) * element_size  # the largest chunk of an even cut
    far = [r for r in range(n) if abs(sent[r] - share) > chunk]
    if not far:
        return None
    law = "2(N-1)/N" if phases == 2 else "(N-1)/N"
    if all(b >= whole for b in sent) and n > 1:
        return (f"each rank sent {sent[0]} bytes for a {nbytes}-byte tensor: the whole tensor "
                f"in every step. A ring step sends one chunk, so that each rank sends {law} of "
                "the tensor in all")
    r = far[0]
    return (f"rank {r} sent {sent[r]} bytes for a {nbytes}-byte tensor on {n} ranks, "
            f"{'more' if sent[r] > share else 'less'} than a ring sends: {law} of the tensor, "
            f"{share:g} bytes here, give or take one chunk ({chunk} bytes), however the chunks "
            "are cut. In a ring every rank sends one chunk per step, N - 1 steps in each phase")


def global_rank_sentence(error: dict, text: str) -> str:
    """For an error in a case on a group of ranks [1, 2] (say) when the file asks for
    ``dist.get_rank()`` without a group: why that rank's number is not the one meant."""
    found = re.search(r"group of ranks \[([\d, ]+)\]", error.get("case") or "")
    if not found or not asks_global_rank(text):
        return ""
    ranks = [int(r) for r in found.group(1).split(",")]
    return (f"In a group of ranks {ranks} rank {ranks[-1]} is the group's rank "
            f"{len(ranks) - 1}: dist.get_rank() without the group gives a rank's number in "
            "the whole world, not in the group.")


def asks_global_rank(text: str) -> bool:
    """Whether the file's code, its ``__main__`` block aside, calls ``get_rank()`` without a
    group (the block's own ``dist.get_rank()`` is right there: it runs on the whole world)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return "get_rank()" in text
    return any(isinstance(n, ast.Call) and not n.args and not n.keywords
               and ast.unparse(n.func).split(".")[-1] == "get_rank"
               for top in code_scope(tree, ()) for n in ast.walk(top))


def rank_name(by_rank: dict, rank: int) -> str:
    """"rank 1", or "rank 2 (the group's rank 1)" in a case on a group that starts elsewhere
    than rank 0 (``by_rank``: the judge's, keyed by the rank's number in the group)."""
    number = by_rank[rank].get("global_rank", rank)
    return f"rank {rank}" if number == rank else f"rank {number} (the group's rank {rank})"
