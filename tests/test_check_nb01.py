"""Exercise checkers of notebook 01 against the reference answers and realistic wrong ones."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.check.core import ExerciseError
from course_lib.check.nb01 import central_difference, logistic_gradient, per_example


def test_central_difference(capsys):
    central_difference(lambda f, x, eps: (f(x + eps) - f(x - eps)) / (2 * eps))
    assert capsys.readouterr().out == "Exercise 1.1: correct.\n"
    with pytest.raises(ExerciseError, match="one-sided"):
        central_difference(lambda f, x, eps: (f(x + eps) - f(x)) / eps)
    with pytest.raises(ExerciseError, match="twice"):
        central_difference(lambda f, x, eps: (f(x + eps) - f(x - eps)) / eps)


def test_logistic_gradient(capsys):
    def right(w, x, y):
        return x.T @ (torch.sigmoid(x @ w) - y) / x.shape[0]

    logistic_gradient(right)
    assert "Exercise 1.2: correct." in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="divide by n"):
        logistic_gradient(lambda w, x, y: x.T @ (torch.sigmoid(x @ w) - y))
    with pytest.raises(ExerciseError, match="sign"):
        logistic_gradient(lambda w, x, y: x.T @ (y - torch.sigmoid(x @ w)) / x.shape[0])
    with pytest.raises(ExerciseError, match="not the gradient"):
        logistic_gradient(lambda w, x, y: x.T @ (x @ w - y) / x.shape[0])  # no sigmoid


def flat(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_per_example(capsys):
    def right(model, x, y):
        rows = []
        for i in range(x.shape[0]):
            model.zero_grad()
            F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
            rows.append(flat(model).clone())
        return torch.stack(rows)

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

    per_example(right)
    assert "Exercise 1.3: correct." in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="zero"):
        per_example(forgot_zero_grad)
    with pytest.raises(ExerciseError, match="one example at a time"):
        per_example(whole_batch)
    with pytest.raises(ExerciseError, match="shape"):
        per_example(lambda model, x, y: right(model, x, y).T)


def test_not_done_yet(capsys):
    def hole(*args):
        raise NotImplementedError("Exercise 1.1: ...")

    central_difference(hole)
    logistic_gradient(hole)
    per_example(hole)
    out = capsys.readouterr().out
    assert "Exercise 1.1: not done yet" in out and "Exercise 1.3: not done yet" in out
