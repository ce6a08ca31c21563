"""Notebook 02's claims: where training memory goes, activations linear in the batch, the wall,
and gradient noise falling like 1 / B."""

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.lessons import gradients, memory
from course_lib.tasks import toy


def big_model():
    return toy.make_mlp(hidden=256, depth=3, norm="layer", seed=0)


@pytest.mark.parametrize("make, copies", [
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
    (lambda p: torch.optim.Adam(p, lr=1e-3), 2),
])
def test_memory_breakdown_per_optimizer(make, copies):
    model = big_model()
    params = memory.parameter_bytes(model)
    assert params == 4 * sum(p.numel() for p in model.parameters())  # float32
    x, y = toy.two_moons(64, seed=1)
    row = memory.memory_breakdown(model, make(model.parameters()), x, y)
    counters = 4 * len(list(model.parameters())) if copies == 2 else 0  # Adam's step tensors
    assert row["parameters"] == params and row["gradients"] == params
    assert row["optimizer state"] == copies * params + counters
    assert row["activations"] > 0


def test_float64_doubles_every_fixed_part():
    model = toy.make_mlp(hidden=16, seed=0, dtype=torch.float64)
    assert memory.parameter_bytes(model) == 8 * sum(p.numel() for p in model.parameters())
    assert memory.gradient_bytes(model) == 0  # no backward yet: no .grad


def test_saved_tensors_count_each_storage_once_and_skip_parameters():
    model = big_model()
    x, y = toy.two_moons(4, seed=2)
    run = lambda: F.cross_entropy(model(x), y)
    saved = memory.saved_tensors(run, exclude=list(model.parameters()))
    # per hidden layer: the Linear output (B, 256), LayerNorm's mean and rstd (B, 1) each, the
    # ReLU output (B, 256), which is also the next Linear's input; then x and the softmax (B, 2),
    # the int64 targets (B,) and one scalar
    assert sum(e["bytes"] for e in saved) == 6 * 4096 + 6 * 16 + 32 + 32 + 32 + 4 == 24772
    assert len(saved) == 16
    with_params = memory.saved_tensor_bytes(run)
    assert with_params > memory.saved_tensor_bytes(run, exclude=list(model.parameters()))


def test_activation_bytes_grow_linearly_with_the_batch():
    model = big_model()
    sizes = [64, 128, 256, 512, 768, 1024]
    measured = [memory.activation_bytes(model, *toy.two_moons(b, seed=b)) for b in sizes]
    slope, intercept, worst = memory.fit_line(sizes, measured)
    assert worst < 0.01
    assert 15 < measured[-1] / measured[0] < 17
    steps = [b - a for a, b in zip(measured, measured[1:], strict=False)]
    assert steps[0] * 2 == steps[1]  # exactly linear on CPU: 128 more examples, twice 64 more
    assert slope == pytest.approx(6 * 1024 + 6 * 4 + 8 + 8 + 8, rel=1e-9)  # the list above / B
    with pytest.raises(ValueError, match="method='cuda'"):
        memory.activation_bytes(model, *toy.two_moons(8), method="cuda")


def test_the_wall():
    params = memory.parameter_bytes(big_model())
    fixed, per_example, budget = 4 * params, 6192, 4 * 2**20
    largest = memory.largest_batch_that_fits(budget, fixed, per_example)
    assert largest == 330
    assert fixed + largest * per_example <= budget < fixed + (largest + 1) * per_example
    assert memory.accumulation_steps_needed(1024, largest) == 4
    assert memory.largest_batch_that_fits(fixed - 1, fixed, per_example) == 0
    with pytest.raises(ValueError, match="not even one example"):
        memory.accumulation_steps_needed(1024, 0)


def test_sixteen_bytes_per_parameter_in_mixed_precision():
    assert 2 + 2 + 4 + 8 == 16
    assert f"{7e9 * 16 / 2**30:.1f}" == "104.3"


def test_gradient_noise_falls_like_one_over_b():
    x, y = toy.two_moons(4096, seed=0)
    model = toy.make_mlp(hidden=32, norm="layer", seed=0)
    per_example = gradients.per_example_grads(model, x, y)
    trace = (per_example - per_example.mean(0)).pow(2).sum(1).mean().item()
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    noise = [gradients.gradient_noise(per_example, b, draws=400, seed=b) for b in sizes]
    slope, _, _ = memory.fit_line([math.log(b) for b in sizes], [math.log(v) for v in noise])
    assert -1.1 < slope < -0.9
    assert all(0.75 < b * v / trace < 1.25 for b, v in zip(sizes, noise, strict=True))
    assert gradients.gradient_noise(per_example, 4096, draws=2) > 0  # with replacement
