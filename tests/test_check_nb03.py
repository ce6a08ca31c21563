"""Exercise checkers of notebook 03 against the reference answers and realistic wrong ones."""

import pytest
import torch.nn.functional as F

from course_lib.check.core import ExerciseError
from course_lib.check.nb03 import accumulate, token_normalisation, uneven_weights


def test_accumulate(capsys):
    def right(model, x, y, k):
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            (F.cross_entropy(model(xm), ym) / k).backward()

    def no_scale(model, x, y, k):
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            F.cross_entropy(model(xm), ym).backward()

    def zero_inside(model, x, y, k):
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            model.zero_grad()
            (F.cross_entropy(model(xm), ym) / k).backward()

    accumulate(right)
    assert capsys.readouterr().out == "Exercise 3.1: correct.\n"
    with pytest.raises(ExerciseError, match="times too large"):
        accumulate(no_scale)
    with pytest.raises(ExerciseError, match="not inside"):
        accumulate(zero_inside)
    with pytest.raises(ExerciseError, match="no .grad"):
        accumulate(lambda model, x, y, k: None)


def test_token_normalisation(capsys):
    token_normalisation(lambda loss_sum, micro, total, k: loss_sum / total)
    assert capsys.readouterr().out == "Exercise 3.2: correct.\n"
    with pytest.raises(ExerciseError, match="mean of micro-batch means"):
        token_normalisation(lambda loss_sum, micro, total, k: loss_sum / micro / k)
    with pytest.raises(ExerciseError, match="3 times too large"):
        token_normalisation(lambda loss_sum, micro, total, k: loss_sum / micro)
    with pytest.raises(ExerciseError, match="not the big batch"):
        token_normalisation(lambda loss_sum, micro, total, k: loss_sum)
    with pytest.raises(ExerciseError, match="return a tensor"):
        token_normalisation(lambda loss_sum, micro, total, k: loss_sum.item() / total)


def test_uneven_weights(capsys):
    uneven_weights(lambda sizes: [n / sum(sizes) for n in sizes])
    assert capsys.readouterr().out == "Exercise 3.3: correct.\n"
    with pytest.raises(ExerciseError, match="only when all micro-batches are the same size"):
        uneven_weights(lambda sizes: [1 / len(sizes)] * len(sizes))
    with pytest.raises(ExerciseError, match="add up to"):
        uneven_weights(lambda sizes: [n / max(sizes) for n in sizes])
    with pytest.raises(ExerciseError, match="one weight per micro-batch"):
        uneven_weights(lambda sizes: [1.0])


def test_not_done_yet(capsys):
    def hole(*args):
        raise NotImplementedError

    accumulate(hole)
    token_normalisation(hole)
    uneven_weights(hole)
    assert capsys.readouterr().out.count("not done yet") == 3
