"""Notebook 01's checkers: the reference answers pass; realistic wrong answers (of the wrong
kind, calling autograd or the course's own version, off by a factor or a sign) get the hint
that names their mistake, in a short report without checker code."""

import numpy as np
import torch
import torch.nn.functional as F
from check_reports import standard_tests

from course_lib.check.nb01 import central_difference, logistic_gradient, per_example
from course_lib.lessons import gradients


def right_central(f, x, eps):
    return (f(x + eps) - f(x - eps)) / (2 * eps)


def with_the_library(f, x, eps):
    return gradients.finite_difference(lambda t: f(float(t)), torch.tensor(x), eps)


CENTRAL_MISTAKES = [
    (lambda f, x, eps: (f(x + eps) - f(x)) / eps, "one-sided difference"),
    (lambda f, x, eps: (f(x) - f(x - eps)) / eps, "one-sided difference"),
    (lambda f, x, eps: (f(x + eps) - f(x - eps)) / eps, "twice the slope"),
    (lambda f, x, eps: (f(x - eps) - f(x + eps)) / (2 * eps), "the wrong sign"),
    (lambda f, x, eps: ((f(x + eps) - f(x - eps)) / (2 * eps),), "the estimate of f'(x); "
                                                                 "your code returned a tuple"),
    (with_the_library, "calls gradients.finite_difference, the course's own version"),
    (lambda f, x, eps: (f(x + 1e-2) - f(x - 1e-2)) / 2e-2, "the distance you divide by"),
    (lambda f, x, eps: (f(x + 1e-5) - f(x - 1e-5)) / 2e-5,  # a step of its own, close enough
     "with eps=0.1 at x=0.7 you return 0.76484219, but the central difference with that step "
     "is 0.76356809"),
]


def right_logistic(w, x, y):
    return x.T @ (torch.sigmoid(x @ w) - y) / x.shape[0]


def right_by_example(w, x, y):  # one example at a time, in w's dtype
    g = torch.zeros_like(w)
    for xi, yi in zip(x, y, strict=True):
        g += (torch.sigmoid(xi @ w) - yi) * xi
    return g / len(x)


def float32_sum(w, x, y):  # right, but torch.zeros(2) is float32
    g = torch.zeros(2)
    for xi, yi in zip(x, y, strict=True):
        g += (torch.sigmoid(xi @ w) - yi) * xi
    return g / len(x)


def from_python_floats(w, x, y):  # right, but torch.tensor of floats is float32
    err = torch.sigmoid(x @ w) - y
    return torch.tensor([(err * x[:, 0]).mean().item(), (err * x[:, 1]).mean().item()])


def with_autograd(w, x, y):
    w = w.clone().requires_grad_()
    gradients.logistic_loss(w, x, y).backward()
    return w.grad


FLOAT32 = "right to float32's precision only: your result is float32"


LOGISTIC_MISTAKES = [
    (lambda w, x, y: x.T @ (torch.sigmoid(x @ w) - y), "50 times too large"),
    (lambda w, x, y: x.T @ (y - torch.sigmoid(x @ w)) / x.shape[0], "the sign is flipped"),
    (lambda w, x, y: x.T @ (x @ w - y) / x.shape[0], "not the gradient of the mean"),
    (lambda w, x, y: (x.T @ (torch.sigmoid(x @ w) - y) / x.shape[0]).tolist(),
     "return a tensor with one entry per weight; your code returned a list"),
    (lambda w, x, y: torch.sigmoid(x @ w) - y, "of shape (2,)"),
    (with_autograd, "asks autograd"),
    (float32_sum, FLOAT32),
    (from_python_floats, FLOAT32),
    (lambda w, x, y: x.float().T @ (torch.sigmoid(x.float() @ w.float()) - y.float()) / len(y),
     FLOAT32),
    (lambda w, x, y: right_logistic(w.float(), x.float(), y.float()).double(),
     "some step of your computation runs in float32"),
    (gradients.logistic_grad_by_hand, "calls gradients.logistic_grad_by_hand, the course's own"),
]


def flat(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def right_per_example(model, x, y):
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append(flat(model).clone())
    return torch.stack(rows)


def filled_in(model, x, y):  # rows written into a tensor made beforehand
    out = torch.zeros(len(x), sum(p.numel() for p in model.parameters()), dtype=x.dtype)
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        out[i] = flat(model)
    return out


def filled_in_float32(model, x, y):  # right, but torch.zeros(B, P) is float32
    out = torch.zeros(len(x), sum(p.numel() for p in model.parameters()))
    out[:] = filled_in(model, x, y)
    return out


def holds_grad_itself(model, x, y):  # zeroed in place and kept, not copied
    rows = []
    for i in range(len(x)):
        model.zero_grad(set_to_none=False)
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append([p.grad for p in model.parameters()])
    return torch.stack([torch.cat([g.reshape(-1) for g in row]) for row in rows])


def forgot_zero_grad(model, x, y):
    rows = []
    for i in range(x.shape[0]):
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append(flat(model).clone())
    return torch.stack(rows)


def whole_batch(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return flat(model).repeat(x.shape[0], 1)


def rows_as_list(model, x, y):
    return list(right_per_example(model, x, y))


PER_EXAMPLE_MISTAKES = [
    (forgot_zero_grad, "nothing in your loop clears it"),
    (holds_grad_itself, "every row is the last example's gradient"),
    (filled_in_float32, FLOAT32),
    (lambda model, x, y: right_per_example(model, x, y).float(), FLOAT32),
    (whole_batch, "your backward runs on the loss of the whole batch"),
    (lambda model, x, y: right_per_example(model, x, y).T,
     "a tensor of shape (6, 114), not (114, 6)"),
    (rows_as_list, "one row per example; your code returned a list of 6 item(s)"),
    (gradients.per_example_grads_loop, "calls gradients.per_example_grads_loop"),
    (gradients.per_example_grads, "calls gradients.per_example_grads, the course's"),
]


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((central_difference, [right_central, lambda f, x, eps:
                                         np.array(right_central(f, x, eps))],  # 0-d array
                    CENTRAL_MISTAKES),
                   (logistic_gradient, [right_logistic, right_by_example], LOGISTIC_MISTAKES),
                   (per_example, [right_per_example, filled_in], PER_EXAMPLE_MISTAKES))
