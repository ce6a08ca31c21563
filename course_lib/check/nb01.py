"""Checkers for the exercises of notebook 01 (gradients)."""

from __future__ import annotations

import math

import torch

from course_lib.check.core import exercise, expect
from course_lib.lessons import gradients
from course_lib.tasks import toy

# (function, its exact derivative, point): smooth functions with known derivatives
_CASES = [
    (lambda x: x**3, lambda x: 3 * x**2, 1.5),
    (math.sin, math.cos, 0.7),
    (math.exp, math.exp, -0.4),
    (lambda x: 1 / (1 + math.exp(-x)), lambda x: math.exp(-x) / (1 + math.exp(-x)) ** 2, 2.0),
]


@exercise("1.1")
def central_difference(my_central_difference) -> None:
    """``my_central_difference(f, x, eps)`` must approximate f'(x) to O(eps^2)."""
    for f, exact, x in _CASES:
        got = my_central_difference(f, x, 1e-4)
        expect(isinstance(got, (float, int)) or torch.is_tensor(got),
               f"return a number, not {type(got).__name__}")
        got = float(got)
        want = exact(x)
        expect(abs(got - 2 * want) > 1e-3 * abs(want) or abs(want) < 1e-9,
               "your result is twice the derivative: divide by 2 * eps, the distance between "
               "the two points")
        expect(abs(got - want) <= 1e-7 * max(1.0, abs(want)),
               f"at x={x} you return {got:.8f} but the derivative is {want:.8f}. Use both sides: "
               "(f(x + eps) - f(x - eps)) / (2 * eps); a one-sided difference is only O(eps)")


@exercise("1.2")
def logistic_gradient(my_logistic_grad) -> None:
    """``my_logistic_grad(w, x, y)``: the hand-derived gradient of the mean logistic loss."""
    for n, seed in ((50, 0), (7, 1)):
        x, y = toy.two_blobs(n, seed=seed, dtype=torch.float64)
        w = torch.tensor([0.3, -0.8], dtype=torch.float64, requires_grad=True)
        (want,) = torch.autograd.grad(gradients.logistic_loss(w, x, y), [w])
        got = my_logistic_grad(w.detach().clone(), x, y)
        expect(torch.is_tensor(got) and got.shape == want.shape,
               f"return a tensor of shape {tuple(want.shape)} (one entry per weight)")
        got = got.detach().double()
        expect(not torch.allclose(got, -want, rtol=1e-6), "the sign is flipped: the error term is "
               "sigmoid(x @ w) - y, prediction minus label")
        expect(not torch.allclose(got, want * n, rtol=1e-6),
               f"your gradient is {n} times too large: the loss is a mean, divide by n")
        expect(torch.allclose(got, want, rtol=1e-9, atol=1e-12),
               "not the gradient of the mean logistic loss: compare each step with "
               "X^T (sigmoid(X w) - y) / n")


@exercise("1.3")
def per_example(my_per_example_grads) -> None:
    """``my_per_example_grads(model, x, y)``: a (B, P) tensor, one gradient per example."""
    model = toy.make_mlp(hidden=8, seed=3, dtype=torch.float64)  # small for speed
    x, y = toy.two_moons(6, seed=2, dtype=torch.float64)
    want = gradients.per_example_grads_loop(model, x, y)
    model.zero_grad(set_to_none=True)
    got = my_per_example_grads(model, x, y)
    expect(torch.is_tensor(got) and got.shape == want.shape,
           f"return one flat gradient per example: a tensor of shape {tuple(want.shape)}")
    got = got.detach().double()
    expect(not torch.allclose(got, want.cumsum(0), rtol=1e-6),
           "row i holds the sum of the gradients of examples 0..i: .grad accumulates, so zero "
           "it (model.zero_grad()) before each example's backward")
    expect(not torch.allclose(got, want.mean(0).expand_as(want), rtol=1e-6),
           "every row is the batch gradient: run backward on one example at a time, x[i:i+1]")
    expect(torch.allclose(got, want, rtol=1e-8, atol=1e-10),
           "some rows differ from the per-example gradients: for each i, zero the grads, "
           "backward the loss of x[i:i+1], y[i:i+1], then flatten every p.grad")
