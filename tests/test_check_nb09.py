"""Notebook 09's checkers: the reference answers pass, realistic wrong answers get a hint."""

import builtins
import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from check_reports import hint_of, shown_report, standard_tests
from IPython.core import interactiveshell
from torch.utils.data.distributed import DistributedSampler

from course_lib.check import nb09
from course_lib.check.cases import ddp_script
from course_lib.check.checker import ExerciseError
from course_lib.check.nb09 import atomic_save, sampler_by_hand
from course_lib.train.checkpoint import write_atomic

tsave = torch.save  # an answer's own name for torch.save, bound when its module is imported


def indices_reference(size, world_size, rank, epoch, seed):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(size, generator=g).tolist()
    total = -(-size // world_size) * world_size
    order += order[: total - size]  # pad by repeating the first indices
    return order[rank:total:world_size]


def indices_without_epoch(size, world_size, rank, epoch, seed):
    return indices_reference(size, world_size, rank, 0, seed)


def indices_without_padding(size, world_size, rank, epoch, seed):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(size, generator=g).tolist()[rank::world_size]


def indices_seeded_by_epoch(size, world_size, rank, epoch, seed):
    return indices_reference(size, world_size, rank, epoch, 0)  # g.manual_seed(epoch)


def indices_seeded_otherwise(size, world_size, rank, epoch, seed):
    return indices_reference(size, world_size, rank, epoch + 99 * seed, 0)  # seed * 100 + epoch


def indices_in_blocks(size, world_size, rank, epoch, seed):
    strided = [indices_reference(size, world_size, r, epoch, seed) for r in range(world_size)]
    everything = [i for r in range(len(strided[0])) for i in (s[r] for s in strided)]
    per_rank = len(strided[0])
    return everything[rank * per_rank:(rank + 1) * per_rank]


def save_reference(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: the old file or the new one, never half of one


def save_through_serialization(obj, path):
    torch.serialization.save(obj, path + ".part")
    os.replace(path + ".part", path)


def save_through_an_alias(obj, path):
    tsave(obj, path + ".tmp")  # torch.save, taken before the checker could replace it
    os.replace(path + ".tmp", path)


def save_into_a_temporary_file(obj, path):
    handle, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        os.remove(tmp)
        raise


def save_with_pathlib(obj, path):
    tmp = Path(path).with_suffix(".new")
    torch.save(obj, tmp)
    tmp.replace(path)


def save_then_move(obj, path):
    torch.save(obj, path + ".tmp")
    shutil.move(path + ".tmp", path)  # a rename within one folder


def save_in_place(obj, path):
    torch.save(obj, path)


def save_never_renamed(obj, path):
    torch.save(obj, path + ".tmp")


def save_swallowing_errors(obj, path):
    try:
        save_reference(obj, path)
    except OSError:
        pass


def save_through_a_buffer(obj, path):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with open(path, "wb") as f:  # the bytes go straight into path
        f.write(buffer.getvalue())


def save_with_write_bytes(obj, path):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    Path(path).write_bytes(buffer.getvalue())


def save_then_copy(obj, path):
    torch.save(obj, path + ".tmp")
    shutil.copyfile(path + ".tmp", path)


def save_after_removing(obj, path):
    if os.path.exists(path):
        os.remove(path)
    torch.save(obj, path)


def save_remove_then_rename(obj, path):
    torch.save(obj, path + ".tmp")
    if os.path.exists(path):
        os.unlink(path)
    os.rename(path + ".tmp", path)


def serialized(step: int) -> bytes:
    buffer = io.BytesIO()
    torch.save({"step": step}, buffer)
    return buffer.getvalue()


SERIALIZED = {step: serialized(step) for step in (1, 2, 3)}


def save_without_torch_save(obj, path):
    with open(path + ".tmp", "wb") as f:
        f.write(SERIALIZED[obj["step"]])  # bytes torch.save made before the checker ran
    os.replace(path + ".tmp", path)


def test_the_checker_puts_every_function_it_replaces_back():
    replaced = [(builtins, "open"), (io, "open"), (os, "open"), (os, "remove"), (os, "unlink"),
                (torch.serialization, "_open_zipfile_writer"),
                (torch.serialization, "_open_file_like")]
    before = [getattr(module, name) for module, name in replaced]
    with pytest.raises(ExerciseError, match="destroyed the previous checkpoint"):
        atomic_save(save_in_place)
    atomic_save(save_reference)
    assert [getattr(module, name) for module, name in replaced] == before


def test_a_notebooks_own_open_is_watched_too():
    """In a notebook, open is IPython's: it calls io.open through a name bound at import."""
    namespace = {"open": interactiveshell._modified_open, "io": io, "torch": torch}
    exec("def save_atomic(obj, path):\n    buffer = io.BytesIO()\n    torch.save(obj, buffer)\n"
         "    with open(path, 'wb') as f:\n        f.write(buffer.getvalue())\n", namespace)
    before = interactiveshell.io_open
    assert "wrote straight into path" in hint_of(atomic_save, namespace["save_atomic"])
    assert interactiveshell.io_open is before


# ---- what a learner sees: the hint, at most 10 lines, none of the checker's code ----------

def indices_with_the_sampler(size, world_size, rank, epoch, seed):
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


SAMPLER_BY_HAND_MISTAKES = [
    (indices_with_the_sampler, "uses DistributedSampler: the point is to write"),
    (lambda size, world_size, rank, epoch, seed: str(
        indices_reference(size, world_size, rank, epoch, seed)),
     "return this rank's indices as a list of whole numbers; your code returned the str"),
    (lambda *args: None, "returned None"),
    (indices_without_epoch, "epoch 1 gives the same order as epoch 0"),
    (indices_without_padding, "is padded by repeating its first indices"),
    (indices_in_blocks, "every world_size-th index"),
    (indices_seeded_by_epoch, "seed 7: your order is the one of seed 0: the seed is left out"),
    (indices_seeded_otherwise, "right with seed 0 but not with seed 7 (position 0 holds"),
    (indices_reference(10, 2, 0, 0, 0), "pass the function itself"),  # called, not passed
]


def save_with_the_library(obj, path):
    write_atomic(path, obj)


ATOMIC_SAVE_MISTAKES = [
    (save_with_the_library, "calls the library's write_atomic"),
    (save_in_place, "destroyed the previous checkpoint: torch.save(obj, path) wrote straight"),
    (save_never_renamed, "there is no file at path"),
    (save_swallowing_errors, "did not reach the caller"),
    (save_through_a_buffer, "open(path, 'wb') in your code wrote straight into path"),
    (save_with_write_bytes, "pathlib.Path.write_bytes, called by your code, wrote straight"),
    (save_then_copy, "shutil.copyfile, called by your code, wrote straight into path"),
    (save_after_removing, "a crash right after os.remove(path) in your code left no checkpoint"),
    (save_remove_then_rename, "a crash right after os.unlink(path) in your code left no"),
    (save_without_torch_save, "your code never called torch.save"),
    ("checkpoint.pt", "pass the function itself"),
]


def test_an_error_inside_save_shows_the_learners_line():
    def save_atomic(obj, path):
        torch.save(obj, path + 1)  # TypeError: a str plus an int

    text = shown_report(atomic_save, save_atomic)
    assert "TypeError" in text and "torch.save(obj, path + 1)" in text


def test_the_script_checker_wants_a_path_and_says_so():
    def train(config):  # the function itself, passed instead of its file
        return {}

    text = shown_report(nb09.my_ddp_train, train)
    assert 'pass the path of your file, check.nb09.my_ddp_train("workspace/my_ddp_train.py")' \
        in text


# ---- exercise 9.3's judge, on what a launch would report (no launch) ------------------

def test_a_sync_on_every_micro_step_names_the_cause_not_the_fix():
    """A loop without no_sync: DDP synchronised every backward (the weights are right)."""
    with pytest.raises(ExerciseError) as caught:
        ddp_script.judge_syncs({"syncs": 24, "steps": 12, "accum_steps": 2}, "model.zero_grad()")
    hint = str(caught.value)
    assert "24 times for 12 optimizer steps: micro-steps that do not end a step" in hint
    assert "no_sync" not in hint, hint


def logged(losses: list, right: list) -> dict:
    return {"returned": {"losses": losses}, "expected": {"losses": right}, "loss_values": 3,
            "steps": 3}


@pytest.mark.parametrize("ranks, accum_steps, factor, words", [
    (3, 2, 3, "3 times too large: they are the sum over the ranks, not their mean"),
    (3, 2, 2, "2 times too large: each micro-step's loss was added as it is"),
    (2, 2, 2, "2 times too large: either they are the sum over the ranks, not their mean, or "
              "each micro-step's loss was added as it is"),
    (3, 2, 1.5, "not the mean loss of each step's global batch"),
])
def test_logged_losses_off_by_a_known_factor_are_named(ranks, accum_steps, factor, words):
    right = [0.7, 0.6, 0.5]
    by_rank = {r: logged([v * factor for v in right], right) for r in range(ranks)}
    with pytest.raises(ExerciseError, match=words):
        ddp_script.judge_losses(by_rank, ranks, accum_steps)


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((sampler_by_hand, [indices_reference,
                                      lambda *args: torch.tensor(indices_reference(*args)),
                                      lambda *args: np.array(indices_reference(*args))],
                    SAMPLER_BY_HAND_MISTAKES, ["expected ["]),
                   (atomic_save, [save_reference, save_through_serialization,
                                  save_through_an_alias, save_into_a_temporary_file,
                                  save_with_pathlib, save_then_move], ATOMIC_SAVE_MISTAKES))
