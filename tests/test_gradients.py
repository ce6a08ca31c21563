"""Notebook 01's claims: autograd == finite differences, the gradient of a mean is a mean."""

from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F

from course_lib.lessons import gradients
from course_lib.tasks import toy


def test_central_difference_of_a_cubic():
    f = lambda w: (w**3).sum()
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    before = w.clone()
    torch.testing.assert_close(gradients.finite_difference(f, w, eps=1e-5), 3 * before**2,
                               rtol=1e-8, atol=1e-9)
    assert torch.equal(w, before)  # every nudge is undone
    with pytest.raises(ValueError, match="contiguous"):
        gradients.finite_difference(f, torch.zeros(3, 2, dtype=torch.float64).T)


def test_central_difference_error_is_v_shaped_and_float64_wins():
    f = lambda w: torch.log1p(torch.exp(-w))
    exact = (torch.sigmoid(torch.tensor(0.5, dtype=torch.float64)) - 1).item()
    best = {}
    for dtype in (torch.float64, torch.float32):
        w0 = torch.tensor(0.5, dtype=dtype)
        best[dtype] = min(abs(((f(w0 + e) - f(w0 - e)) / (2 * e)).item() - exact)
                          for e in (10.0**-k for k in range(1, 13)))
    assert best[torch.float64] < 1e-9
    assert best[torch.float32] > 1e-6


def test_logistic_gradient_three_ways():
    x, y = toy.two_blobs(200, seed=0, dtype=torch.float64)
    w = torch.tensor([-2.0, 2.0], dtype=torch.float64, requires_grad=True)
    (auto,) = torch.autograd.grad(gradients.logistic_loss(w, x, y), [w])
    hand = gradients.logistic_grad_by_hand(w.detach(), x, y)
    fd = gradients.finite_difference(lambda v: gradients.logistic_loss(v, x, y),
                                     w.detach().clone())
    torch.testing.assert_close(hand, auto, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fd, auto, rtol=1e-8, atol=1e-10)


def test_autograd_equals_finite_differences_on_an_mlp():
    model = toy.make_mlp(hidden=8, norm="layer", seed=0, dtype=torch.float64)
    x, y = toy.two_moons(64, seed=0, dtype=torch.float64)
    fd = gradients.flatten(gradients.finite_difference_model(
        model, lambda: F.cross_entropy(model(x), y)))
    auto = gradients.batch_grad(model, x, y)
    assert auto.numel() == 146
    assert gradients.relative_error(auto, fd) < 1e-7
    wrong = auto.clone()
    wrong[0] += 1e-3  # the comparison can fail
    assert gradients.relative_error(wrong, fd) > 1e-7


def test_mean_of_per_example_gradients_is_the_batch_gradient():
    model = toy.make_mlp(hidden=32, norm="layer", seed=0)
    x, y = toy.two_moons(128, seed=1)
    loop = gradients.per_example_grads_loop(model, x, y)
    fast = gradients.per_example_grads(model, x, y)
    batch = gradients.batch_grad(model, x, y)
    assert loop.shape == (128, batch.numel())
    torch.testing.assert_close(fast, loop, rtol=1e-5, atol=1e-7)
    assert gradients.relative_error(loop.mean(0), batch) <= 1e-6
    torch.testing.assert_close(loop.mean(0), batch, rtol=1e-5, atol=1e-7)
    assert gradients.relative_error(loop.sum(0), batch) > 0.5  # a sum is not a mean
    halves = (gradients.batch_grad(model, x[:64], y[:64])
              + gradients.batch_grad(model, x[64:], y[64:])) / 2
    torch.testing.assert_close(halves, batch, rtol=1e-5, atol=1e-7)


def test_grad_accumulates_and_zero_grad_clears():
    model = toy.make_mlp(hidden=32, norm="layer", seed=0)
    x, y = toy.two_moons(128, seed=1)
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    once = gradients.flat_grad(model).clone()
    F.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(gradients.flat_grad(model), 2 * once)
    model.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    for rows in (slice(0, 64), slice(64, 128)):
        (F.cross_entropy(model(x[rows]), y[rows]) / 2).backward()
    torch.testing.assert_close(gradients.flat_grad(model), once, rtol=1e-5, atol=1e-7)


def test_gradient_descent_and_the_learning_rate():
    x, y = toy.two_blobs(200, seed=0, dtype=torch.float64)
    loss_of_w = lambda v: gradients.logistic_loss(v, x, y)
    w0 = torch.tensor([-2.0, 2.0], dtype=torch.float64)
    runs = {lr: gradients.gradient_descent(loss_of_w, w0, lr, steps=15) for lr in (0.03, 0.3, 3)}
    path, losses = runs[0.3]
    assert path.shape == (16, 2) and len(losses) == 16
    assert torch.equal(path[0], w0)
    assert all(b <= a for a, b in pairwise(losses))  # a small step always goes down
    assert runs[0.3][1][-1] < runs[0.03][1][-1]
    big = runs[3][1]
    assert any(b > a for a, b in pairwise(big))  # too large: up on some steps


def test_loss_grid_matches_point_by_point():
    x, y = toy.two_blobs(50, seed=0, dtype=torch.float64)
    loss_of_w = lambda v: gradients.logistic_loss(v, x, y)
    w1 = torch.linspace(-1, 1, 5, dtype=torch.float64)
    w2 = torch.linspace(-2, 2, 3, dtype=torch.float64)
    grid = gradients.loss_grid(loss_of_w, w1, w2)
    assert grid.shape == (3, 5)
    torch.testing.assert_close(grid[2, 1], loss_of_w(torch.stack([w1[1], w2[2]])))
    assert gradients.relative_error(torch.zeros(3), torch.zeros(3)) == 0.0


def test_scalar_derivative_three_ways():
    f = lambda w: torch.log1p(torch.exp(-w))  # notebook 01, section 1
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    by_hand = (torch.sigmoid(w) - 1).detach()
    eps = 1e-6
    by_differences = ((f(w + eps) - f(w - eps)) / (2 * eps)).detach()
    f(w).backward()
    torch.testing.assert_close(w.grad, by_hand, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(by_differences, by_hand, rtol=1e-8, atol=1e-10)
    assert f"{by_hand.item():.8f}" == "-0.37754067"
