"""course_lib.lessons.capstone: measured memory, the challenge's design, splits, and real runs."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from course_lib.lessons import capstone
from course_lib.lessons.capstone import KIB, Challenge, Split
from course_lib.tasks.models import count_parameters, parameter_checksum
from course_lib.train.config import DEFAULT_MICRO_BATCH, TrainConfig
from course_lib.train.trainer import build

SIZES = (1, 2, 4, 8, 16)


def test_the_measured_model_is_the_trainers():
    theirs, _ = build(TrainConfig(), SimpleNamespace(device=torch.device("cpu")))
    assert parameter_checksum(capstone.trainer_model()) == parameter_checksum(theirs)


def test_memory_parts_add_up_and_activations_grow_linearly():
    model = capstone.trainer_model()
    params = 4 * count_parameters(model)  # float32: 4 bytes a number
    tensors = len(list(model.parameters()))
    rows = [capstone.memory_per_process(b) for b in SIZES]
    for row in rows:
        assert row["parameters"] == params and row["gradients"] == params
        # AdamW: two moments per parameter, plus a small step counter per tensor
        assert 2 * params <= row["optimizer state"] <= 2 * params + 8 * tensors
        assert row["total"] == sum(row[k] for k in capstone.PARTS)
    activations = [row["activations"] for row in rows]
    slope = activations[1] - activations[0]
    assert slope > 0
    for b, measured in zip(SIZES, activations, strict=True):
        assert measured == activations[0] + slope * (b - 1)  # exactly linear in the batch


def test_the_budget_separates_small_from_large_micro_batches():
    c = Challenge()
    fits = {b: capstone.memory_per_process(b, c)["total"] <= c.budget_bytes for b in SIZES}
    assert fits == {1: True, 2: True, 4: True, 8: True, 16: False}
    assert not fits[DEFAULT_MICRO_BATCH]  # the trainer's default does not fit: a real choice
    assert capstone.memory_per_process(1, c)["total"] < c.budget_bytes / 2 < c.budget_bytes


def brute_force_splits(memory_of, budget, size, max_nproc):
    return [Split(n, k, b) for n, k, b in itertools.product(range(1, max_nproc + 1),
                                                            range(1, size + 1),
                                                            range(1, size + 1))
            if n * k * b == size and memory_of(b) <= budget]


@pytest.mark.parametrize("fixed, per, budget, size, max_nproc", [
    (400, 50, 1000, 32, 2), (400, 50, 1000, 36, 3), (400, 50, 1000, 24, 3),
    (400, 50, 1000, 30, 4), (400, 50, 420, 8, 2), (0, 7, 100, 48, 4)])
def test_fewest_micro_steps_against_brute_force(fixed, per, budget, size, max_nproc):
    memory_of = lambda b: fixed + per * b
    every = brute_force_splits(memory_of, budget, size, max_nproc)
    best = capstone.fewest_micro_steps(memory_of, budget, size, max_nproc)
    if not every:
        assert best is None
        return
    fewest = min(s.accum_steps for s in every)
    assert best == min((s for s in every if s.accum_steps == fewest), key=lambda s: s.nproc)
    for n in range(1, max_nproc + 1):
        if size % n == 0:
            largest = capstone.largest_micro_batch(memory_of, budget, size // n)
            assert largest == max([s.micro_batch for s in every if s.nproc == n], default=0)


def test_splits_that_fit_are_every_legal_split():
    c = Challenge()
    memory_of = lambda b: capstone.memory_per_process(b, c)["total"]
    found = capstone.splits_that_fit(c, max_nproc=2)
    assert set(found) == set(brute_force_splits(memory_of, c.budget_bytes, 32, 2))
    assert found[0] == Split(2, 2, 8)  # fewest micro-steps first
    assert all(capstone.problems_before_training(s, c) == [] for s in found)


def test_problems_before_training_say_what_to_change():
    c = Challenge()
    [memory] = capstone.problems_before_training(Split(2, 1, 16), c)
    kib = capstone.memory_per_process(16, c)["total"] / KIB
    assert f"needs {kib:.0f} KiB" in memory and "smaller micro-batch" in memory
    [batch] = capstone.problems_before_training(Split(2, 1, 8), c)
    assert "= 16, but the challenge fixes 32" in batch and "accum_steps = 2" in batch
    assert len(capstone.problems_before_training(Split(5, 1, 32), c)) == 3
    with pytest.raises(ValueError, match="accum_steps must be"):
        capstone.as_split((1, 0, 32))


@pytest.mark.slow
def test_two_splits_of_the_same_global_batch_train_alike():
    """One launch per world size: 1 x 4 x 8 and 2 x 2 x 8 see the same batches."""
    short = capstone.shorter(Challenge(), steps=6)
    alone = capstone.run_split(Split(1, 4, 8), short)
    pair = capstone.run_split(Split(2, 2, 8), short)
    for run in (alone, pair):
        assert run["global_batch"] == 32 and run["steps"] == 6 and run["replicas_bitwise_equal"]
        assert run["final_loss"] == pytest.approx(sum(run["losses"]) / 6)
    torch.testing.assert_close(torch.tensor(pair["losses"]), torch.tensor(alone["losses"]),
                               rtol=1e-5, atol=1e-5)
    assert alone["losses"][-1] < alone["losses"][0]  # it learns
