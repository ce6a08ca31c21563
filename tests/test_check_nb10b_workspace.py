"""Exercises 10.6 and 10.7: ZeRO-2's bucket hook (workspace/my_zero2.py) and ZeRO-3's gather,
free and reduce-scatter of one wrapped module (workspace/my_flat_shard.py), launched on several
processes inside the course's Zero2 and fully_shard. The references are the notebook's own
files; other right answers pass too, and each wrong answer, an edit of the reference launched
on 2 processes (3 where the mistake needs a group that is not the world), gets the hint that
names its mistake and no other."""

import re

import pytest
from answer_edits import edited, reference, skeleton
from check_reports import assert_correct, assert_names_its_mistake, wrong_file_hint
from shared_launch import share_launches

from course_lib.check import nb10b
from course_lib.check.cases import shard_unit_cases, zero2_cases
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import has_passed

pytestmark = pytest.mark.slow

# ---- 10.6: ZeRO-2's hook ---------------------------------------------------------------------

ZERO2 = reference("my_zero2.py")
SIZES = "    rank, n = dist.get_rank(group), dist.get_world_size(group)\n"
REDUCE = "    ring_reduce_scatter(grads, group)  # my chunk of grads now holds the sum over the " \
         "ranks\n"
MEAN = "mean = grads[rank * s:(rank + 1) * s] / n"
ACCUMULATE = "    if piece.grad is None:\n        piece.grad = mean\n    else:\n" \
             "        piece.grad += mean  # a second backward before the step: gradients add up\n"

ZERO2_RIGHT = {  # other ways to write it: each passes
    "divided before the reduce-scatter": [
        (REDUCE, "    grads /= n  # each rank's share of the mean, before the sum\n"
                 "    ring_reduce_scatter(grads, group)  # my chunk: the mean itself\n"),
        (MEAN, "mean = grads[rank * s:(rank + 1) * s].clone()")],
    "a copy divided in place, added in place": [
        (MEAN, "mean = grads[rank * s:(rank + 1) * s].clone().div_(n)"),
        (ACCUMULATE, "    if piece.grad is None:\n        piece.grad = mean\n    else:\n"
                     "        piece.grad.add_(mean)\n")],
}
ZERO2_MISTAKES = {  # name: (the edits, what the hint says, world size)
    "no average": ([(MEAN, "mean = grads[rank * s:(rank + 1) * s].clone()")],
                   "the step used the SUM of the ranks' gradients", 2),
    "a view of the bucket": ([(MEAN, "mean = grads[rank * s:(rank + 1) * s].div_(n)")],
                             "rank 0's piece.grad shares its memory with grads", 2),
    "overwritten, not accumulated": ([(ACCUMULATE, "    piece.grad = mean\n")],
                                     "only the last one's gradient counted", 2),
    "an all-reduce": ([("import ring_reduce_scatter", "import ring_all_reduce"),
                       (REDUCE, "    ring_all_reduce(grads, group)\n")],
                      "your hook all-reduces the bucket (ring_all_reduce)", 2),
    "torch's reduce_scatter_tensor": ([(REDUCE, "    mine = torch.empty(s, dtype=grads.dtype)\n"
                                                "    dist.reduce_scatter_tensor(mine, grads, "
                                                "group=group)\n"),
                                       (MEAN, "mean = mine / n")],
                                      "your hook calls dist.reduce_scatter_tensor: Gloo runs "
                                      "it as an all-reduce", 2),
    "the next rank's chunk": ([(MEAN, "k = (rank + 1) % n\n    mean = grads[k * s:(k + 1) * "
                                      "s] / n")],
                              "rank 0's piece.grad got the mean of chunk 1 of the bucket", 2),
    "the world's size": ([(SIZES, "    rank, n = dist.get_rank(group), dist.get_world_size()\n")],
                         "the gradients were divided by 3, the size of the whole world", 3),
    "the ring on the whole world": ([("ring_reduce_scatter(grads, group)",
                                      "ring_reduce_scatter(grads)")],
                                    "ring_reduce_scatter sent on the whole world, ranks 0..2, "
                                    "but this case gave your function a group of ranks [0, 1]",
                                    3),
    "no gradient left": ([(ACCUMULATE, "    if piece.grad is not None:\n"
                                       "        piece.grad += mean\n")],
                         "after your hook, rank 0's piece.grad is None", 2),
}
ZERO2_MARKS = ("the SUM", "shares its memory", "only the last one's", "all-reduces",
               "reduce_scatter_tensor", "got the mean of chunk", "size of the whole world",
               "sent on the whole world", "is None", "differ from plain")


@pytest.fixture(scope="module", autouse=True)
def shared_launches():
    """One launch per world size for the answers that run to the end (shared_launch.py)."""
    zero2 = [(ZERO2, 4), *((edited(ZERO2, edits), 3) for edits in ZERO2_RIGHT.values())]
    zero2 += [(edited(ZERO2, ZERO2_MISTAKES[name][0]), ZERO2_MISTAKES[name][2]) for name in (
        "no average", "a view of the bucket", "overwritten, not accumulated", "an all-reduce",
        "torch's reduce_scatter_tensor", "the next rank's chunk", "the world's size")]
    share_launches(nb10b.ZERO2_CASES, "my_zero2.py", zero2)
    units = [(UNIT, 3), *((edited(UNIT, edits), 2) for edits in UNIT_RIGHT.values())]
    units += [(edited(UNIT, UNIT_MISTAKES[name][0]), 2)
              for name in ("a sum, not a mean", "overwritten, not accumulated")]
    share_launches(nb10b.SHARD_UNIT_CASES, "my_flat_shard.py", units)


def test_the_zero2_reference_passes_and_is_recorded(workspace, capsys):
    """On 4 processes (a group of 3 among them); nbval runs it on 2, 3 and 4."""
    path = workspace.put(ZERO2, "my_zero2.py")
    assert_correct(nb10b.my_zero2, path, capsys, world_sizes=(4,))
    assert has_passed("10.6", path)


@pytest.mark.parametrize("name", ZERO2_RIGHT)
def test_other_right_zero2_hooks_pass(workspace, capsys, name):
    path = workspace.put(edited(ZERO2, ZERO2_RIGHT[name]), "my_zero2.py")
    assert_correct(nb10b.my_zero2, path, capsys, world_sizes=(3,))


@pytest.mark.parametrize("name", ZERO2_MISTAKES)
def test_a_wrong_zero2_hook_gets_the_hint_that_names_its_mistake(workspace, name):
    edits, words, n = ZERO2_MISTAKES[name]
    path = workspace.put(edited(ZERO2, edits), "my_zero2.py")
    hint = wrong_file_hint(nb10b.my_zero2, path, n, nb10b, zero2_cases)
    assert_names_its_mistake(hint, words, ZERO2_MARKS, n)


def test_the_references_of_the_mistakes_differ():
    spec = zero2_cases.case_specs(3, {})[1]
    assert spec["accum"] == 2
    plain = zero2_cases.reference(spec)
    assert zero2_cases.reference(spec, grad_scale=3) != plain
    assert zero2_cases.reference(spec, last_micro_only=True) != plain


# ---- 10.7: ZeRO-3's gather, free and reduce-scatter ------------------------------------------

UNIT = reference("my_flat_shard.py")
DATA = "    full = unit.full.data  # the same memory; writes here are not versions autograd " \
       "counts\n"
WHOLE = "    if full.untyped_storage().nbytes() > 0:"
PLACE = "    full[r * s:(r + 1) * s] = unit.shard.detach()  # my shard in its place (in full's " \
        "dtype)\n"
GATHER = "    ring_all_gather(full, unit.process_group)  # every other shard, from its owner\n"
FREE = "    unit.full.untyped_storage().resize_(0)  # 0 bytes; the tensor and its views stay\n"
GRAD_FREED = "    unit.full.grad = None  # the whole gradient lives on only until it is reduced\n"
HOOK = "    reduce_scatter_bucket(grad, unit.shard, unit.process_group)  # ZeRO-2's hook, as is\n"
OWN_REDUCE = "    r, s, n = unit.rank, unit.shard_numel, unit.world_size\n" \
             "    zero2.ring_reduce_scatter(grad, unit.process_group)\n"

UNIT_RIGHT = {
    "torch's all_gather_into_tensor, its own reduce-scatter": [
        (PLACE + GATHER, "    mine = unit.shard.detach().to(full.dtype)\n"
                         "    dist.all_gather_into_tensor(full, mine, group=unit.process_group)\n"),
        (HOOK, "    n, r, s = unit.world_size, unit.rank, unit.shard_numel\n"
               "    ring_reduce_scatter(grad, unit.process_group)\n"
               "    mean = grad[r * s:(r + 1) * s] / n\n"
               "    unit.shard.grad = mean if unit.shard.grad is None else unit.shard.grad + "
               "mean\n"),
        ("from course_lib.core.collectives import ring_all_gather",
         "from course_lib.core.collectives import ring_reduce_scatter")],
    "the gradient freed after it is reduced, through the full tensor": [
        (GRAD_FREED, ""),
        ("    reshard(unit)  # the parameters too, until the next forward\n",
         "    unit.full.grad = None  # the whole gradient, freed once reduced\n"
         "    reshard(unit)\n")],
}
UNIT_MISTAKES = {  # name: (the edits, what the hint says)
    "not freed after forward": ([(FREE, "    unit.full.grad = None\n")],
                                "after its forward, reshard(unit) for blocks.0, unit.full "
                                "still holds"),
    "not freed after backward": ([("    reshard(unit)  # the parameters too, until the next "
                                   "forward\n", "")],
                                 "after reduce_grad(unit) for blocks.1, unit.full still holds"),
    "the gradient kept": ([(GRAD_FREED, "")], "unit.full.grad still holds this rank's whole "
                                              "gradient"),
    "a write autograd counts": ([(DATA, "    full = unit.full\n"),
                                 (PLACE + GATHER, "    with torch.no_grad():\n"
                                  "        full[r * s:(r + 1) * s] = unit.shard.detach()\n"
                                  "        ring_all_gather(full, unit.process_group)\n")],
                                "backward could not use the parameters it saved in forward"),
    "never gathered": ([(WHOLE, "    if full.numel() > 0:")],
                       "after unshard(unit) for the root before its forward, unit.full has 0 "
                       "bytes of memory"),
    "no second gather before backward": (
        [(WHOLE + "\n        return  # whole already\n",
          "    if full.untyped_storage().nbytes() > 0 or getattr(unit, 'gathered', False):\n"
          "        return  # gathered once already\n    unit.gathered = True\n")],
        "after unshard(unit) for the root before its backward, unit.full has 0 bytes"),
    "its shard put in after the gather": ([(PLACE + GATHER, GATHER + PLACE)],
                                          "after unshard(unit) for the root, values "),
    "gathered again when whole": ([(WHOLE + "\n        return  # whole already\n", "")],
                                  "unshard(unit) for blocks.0 gathered again while unit.full "
                                  "was whole already"),
    "other memory instead of none": ([(FREE, "    unit.full.data = torch.empty(0, dtype=unit."
                                             "full.dtype)\n")],
                                     "reshard(unit) for blocks.0 gave unit.full other memory"),
    "gathers in a different order on each rank": (
        [(GATHER, "    n = dist.get_world_size(unit.process_group)\n"
                  "    for owner in [r] + [o for o in range(n) if o != r]:  # mine first\n"
                  "        dist.broadcast(full[owner * s:(owner + 1) * s], src=owner,\n"
                  "                       group=unit.process_group)\n")],
        "every rank waits in broadcast (line "),
    "a sum, not a mean": ([(HOOK, OWN_REDUCE + "    unit.shard.grad = grad[r * s:(r + 1) * "
                                               "s].clone()\n")],
                          "the steps used the SUM of the ranks' gradients"),
    "the shard's gradient a view of the whole": ([(HOOK, OWN_REDUCE + "    unit.shard.grad = "
                                                   "grad[r * s:(r + 1) * s].div_(n)\n")],
                                                 "unit.shard.grad shares its memory with the "
                                                 "module's whole gradient"),
    "overwritten, not accumulated": ([(HOOK, OWN_REDUCE + "    unit.shard.grad = grad[r * s:"
                                                         "(r + 1) * s] / n\n")],
                                     "what an earlier one left in unit.shard.grad must stay"),
}
UNIT_MARKS = ("after its forward", "after reduce_grad(unit) for blocks.1, unit.full still",
              "unit.full.grad still", "backward could not", "before its forward, unit.full has 0",
              "before its backward, unit.full has 0",
              "for the root, values ", "gathered again", "other memory", "waits in broadcast",
              "the SUM", "unit.shard.grad shares", "an earlier one left")


def test_the_unit_reference_passes_and_is_recorded(workspace, capsys):
    path = workspace.put(UNIT, "my_flat_shard.py")
    nb10b.my_flat_shard(path, world_sizes=(3,))
    assert capsys.readouterr().out.endswith("Exercise 10.7: correct.\n")
    assert has_passed("10.7", path)


@pytest.mark.parametrize("name", UNIT_RIGHT)
def test_other_right_units_pass(workspace, capsys, name):
    nb10b.my_flat_shard(workspace.put(edited(UNIT, UNIT_RIGHT[name]), "my_flat_shard.py"),
                        world_sizes=(2,))
    assert capsys.readouterr().out.endswith("Exercise 10.7: correct.\n")


@pytest.mark.parametrize("name", UNIT_MISTAKES)
def test_a_wrong_unit_gets_the_hint_that_names_its_mistake(workspace, name):
    edits, words = UNIT_MISTAKES[name]
    path = workspace.put(edited(UNIT, edits), "my_flat_shard.py")
    hint = wrong_file_hint(nb10b.my_flat_shard, path, 2, nb10b, shard_unit_cases)
    assert_names_its_mistake(hint, words, UNIT_MARKS, 2)


def test_the_skeletons_are_not_done_yet(workspace, capsys):
    nb10b.my_zero2(workspace.put(skeleton("my_zero2.py"), "my_zero2.py"))
    nb10b.my_flat_shard(workspace.put(skeleton("my_flat_shard.py"), "my_flat_shard.py"))
    out = capsys.readouterr().out
    assert "Exercise 10.6: not done yet" in out and "Exercise 10.7: not done yet" in out


def torchrun(path: str) -> str:
    """What the file's own test (its ``__main__`` block) prints under torchrun on 2 processes
    (``launch`` runs torchrun's agent, forked from a process that imported it once)."""
    return launch(path, nproc=2, timeout_s=120, quiet=True).output


def test_both_files_run_unchanged_under_torchrun(workspace):
    out = torchrun(workspace.put(ZERO2, "my_zero2.py"))
    weights = re.findall(r"rank \d: weight\[0\] = (\[[^\]]*\]), my gradient: \[(\d+)\] values",
                         out)
    assert len(weights) == 2 and len({w for w, _ in weights}) == 1, out  # the replicas agree
    assert {n for _, n in weights} == {"8"}, out  # 15 values: 8 a rank, one of them padding
    out = torchrun(workspace.put(UNIT, "my_flat_shard.py"))
    gathered = re.findall(r"rank \d: gathered (\[[^\]]*\])", out)
    assert len(gathered) == 2 and gathered[0] == gathered[1], out
    assert len(re.findall(r"rank \d: freed, full holds 0 bytes", out)) == 2, out
