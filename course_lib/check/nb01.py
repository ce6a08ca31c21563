"""Checkers for the exercises of notebook 01 (gradients)."""

from __future__ import annotations

import math

import torch

from course_lib.check.answers import as_number, expect_full_precision, expect_type
from course_lib.check.checker import exercise, expect
from course_lib.check.own_work import call_own
from course_lib.lessons import gradients
from course_lib.tasks import toy

# (function, its exact derivative, point): smooth functions with known derivatives
_CASES = [
    (lambda x: x**3, lambda x: 3 * x**2, 1.5),
    (math.sin, math.cos, 0.7),
    (math.exp, math.exp, -0.4),
    (lambda x: 1 / (1 + math.exp(-x)), lambda x: math.exp(-x) / (1 + math.exp(-x)) ** 2, 2.0),
]
AUTOGRAD = [torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward]
BY_HAND = ("your code asks autograd for the gradient: the exercise is to write it from the "
           "formula you derive by hand, with plain tensor operations")


@exercise("1.1")
def central_difference(my_central_difference) -> None:
    """``my_central_difference(f, x, eps)`` must approximate f'(x) to O(eps^2)."""
    eps = 1e-4
    for f, exact, x in _CASES:
        got = as_number(call_own(my_central_difference, f, x, eps,
                                 library=[gradients.finite_difference]),
                        "return one number, the estimate of f'(x)")
        want = exact(x)
        near = abs(want) * 1e-3  # room for an O(eps) error, not for a wrong formula
        expect(abs(got - 2 * want) > near, "your result is twice the slope: look at how far "
                                           "apart the two points you compare are")
        expect(abs(got + want) > near, "your result has the wrong sign: your difference takes "
                                       "the value at the later point from the earlier one")
        one_sided = ((f(x + eps) - f(x)) / eps, (f(x) - f(x - eps)) / eps)  # error O(eps)
        expect(min(abs(got - s) for s in one_sided) > 1e-12,
               "this is a one-sided difference: both points lie on one side of x (x itself is "
               "one of them), so its error shrinks only like eps")
        expect(abs(got - want) <= 1e-7 * max(1.0, abs(want)),
               f"at x={x} you return {got:.8f} but the derivative is {want:.8f}: further off "
               "than a step of eps on either side of x leaves; look at the points your code "
               "compares and the distance you divide by")
    f, wide, x = math.sin, 0.1, 0.7  # a large step: an eps the code ignores shows
    got = as_number(call_own(my_central_difference, f, x, wide,
                             library=[gradients.finite_difference]),
                    "return one number, the estimate of f'(x)")
    want = (f(x + wide) - f(x - wide)) / (2 * wide)
    expect(abs(got - want) <= 1e-9, f"with eps={wide} at x={x} you return {got:.8f}, but the "
                                    f"central difference with that step is {want:.8f}: step "
                                    "by the eps you are given, not by one of your own")


@exercise("1.2")
def logistic_gradient(my_logistic_grad) -> None:
    """``my_logistic_grad(w, x, y)``: the hand-derived gradient of the mean logistic loss."""
    for n, seed in ((50, 0), (7, 1)):
        x, y = toy.two_blobs(n, seed=seed, dtype=torch.float64)
        w = torch.tensor([0.3, -0.8], dtype=torch.float64, requires_grad=True)
        (want,) = torch.autograd.grad(gradients.logistic_loss(w, x, y), [w])
        got = call_own(my_logistic_grad, w.detach().clone(), x, y,
                       library=[gradients.logistic_grad_by_hand, *AUTOGRAD],
                       hint=dict.fromkeys(AUTOGRAD, BY_HAND))
        expect_type(got, torch.Tensor, "return a tensor with one entry per weight")
        expect(got.shape == want.shape,
               f"return a tensor of shape {tuple(want.shape)} (one entry per weight), not "
               f"{tuple(got.shape)}")
        raw, got = got.detach(), got.detach().double()
        expect(not torch.allclose(got, -want, rtol=1e-6),
               "the sign is flipped: check the order in the error term, prediction against label")
        expect(not torch.allclose(got, want * n, rtol=1e-6),
               f"your gradient is {n} times too large: the loss is a mean over the examples")
        expect_full_precision(raw, want, "w's dtype")
        expect(torch.allclose(got, want, rtol=1e-9, atol=1e-12),
               "not the gradient of the mean logistic loss: check each factor of the chain "
               "rule (the sigmoid's derivative, the logit's derivative in w) and the mean")


@exercise("1.3")
def per_example(my_per_example_grads) -> None:
    """``my_per_example_grads(model, x, y)``: a (B, P) tensor, one gradient per example."""
    model = toy.make_mlp(hidden=8, seed=3, dtype=torch.float64)  # small for speed
    x, y = toy.two_moons(6, seed=2, dtype=torch.float64)
    want = gradients.per_example_grads_loop(model, x, y)
    model.zero_grad(set_to_none=True)
    got = call_own(my_per_example_grads, model, x, y,
                   library=[gradients.per_example_grads_loop, gradients.per_example_grads])
    expect_type(got, torch.Tensor, f"return one tensor of shape {tuple(want.shape)}, one row "
                                   "per example")
    expect(got.shape == want.shape,
           f"return one flat gradient per example: a tensor of shape {tuple(want.shape)}, "
           f"not {tuple(got.shape)}")
    expect_full_precision(got.detach(), want, "the model's dtype", rtol=1e-8, atol=1e-10)
    got = got.detach().double()
    expect(len(got) == 1 or not torch.allclose(got, want[-1].expand_as(want), rtol=1e-6),
           "every row is the last example's gradient: your rows hold .grad itself, which the "
           "next backward overwrites in place; keep a copy of each example's gradient")
    expect(not torch.allclose(got, want.cumsum(0), rtol=1e-6),
           "row i holds the sum of the gradients of examples 0..i: .grad keeps adding up "
           "from one backward call to the next, and nothing in your loop clears it")
    expect(not torch.allclose(got, want.mean(0).expand_as(want), rtol=1e-6),
           "every row is the whole batch's gradient: your backward runs on the loss of the "
           "whole batch, not on one example's")
    expect(torch.allclose(got, want, rtol=1e-8, atol=1e-10),
           "some rows differ from the per-example gradients: check that row i comes from "
           "example i alone, with every parameter's gradient, in model.parameters() order")
