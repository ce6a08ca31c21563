"""Toy data and models: deterministic from a seed, and the global generator left alone."""

import pytest
import torch

from course_lib.tasks import toy


def test_two_moons_is_a_function_of_the_seed():
    x, y = toy.two_moons(100, seed=3)
    x2, y2 = toy.two_moons(100, seed=3)
    assert x.shape == (100, 2) and y.shape == (100,)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, toy.two_moons(100, seed=4)[0])
    assert int(y.sum()) == 50  # balanced classes


def test_two_blobs_has_float_labels_and_two_spreads():
    x, y = toy.two_blobs(2000, seed=0, dtype=torch.float64)
    assert x.dtype == torch.float64 and set(y.tolist()) == {0.0, 1.0}
    spread = x.std(dim=0)
    assert spread[1] > 2 * spread[0]  # the long valley of notebook 01 needs unequal spreads
    assert torch.equal(x, toy.two_blobs(2000, seed=0, dtype=torch.float64)[0])


def test_data_and_models_leave_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    toy.two_moons(10, seed=0)
    toy.two_blobs(10, seed=0)
    toy.make_mlp(seed=5, norm="batch", dropout=0.1)
    assert torch.equal(torch.rand(3), expected)


def test_make_mlp_depends_on_the_seed_and_builds_the_asked_norm():
    a, b = toy.make_mlp(seed=1), toy.make_mlp(seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = toy.make_mlp(seed=2)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))
    kinds = {type(m).__name__ for m in toy.make_mlp(norm="layer", dropout=0.2).modules()}
    assert {"LayerNorm", "Dropout"} <= kinds and "BatchNorm1d" not in kinds
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in toy.make_mlp(norm="batch").modules())
    assert toy.make_mlp(dtype=torch.float64)(torch.zeros(4, 2, dtype=torch.float64)).shape == (4, 2)
    with pytest.raises(ValueError, match="norm="):
        toy.make_mlp(norm="group")


def test_batches_depend_only_on_seed_and_step():
    x, y = toy.two_moons(64, seed=0)
    first = toy.batches(x, y, 16, steps=6, seed=1)
    again = toy.batches(x, y, 16, steps=3, seed=1)
    assert len(first) == 6 and first[0][0].shape == (16, 2)
    for (xa, ya), (xb, yb) in zip(first[:3], again, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    pass_rows = torch.cat([xb for xb, _ in first[:4]])  # one pass covers every example once
    assert torch.equal(pass_rows.sort(dim=0).values, x.sort(dim=0).values)
    with pytest.raises(ValueError, match="batch_size"):
        toy.batches(x, y, 65, steps=1)
