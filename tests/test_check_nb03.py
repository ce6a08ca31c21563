"""Notebook 03's checkers: the reference answers pass; realistic wrong answers (of the wrong
kind, detached, calling the course's own version, off by a factor, a mean of means) get the
hint that names their mistake, and only that one, in a short report without checker code.

Exercise 3.3 has no "calls the course's own version" case: no course function returns the
weights (the notebook's pitfalls.uneven_accumulated_grad returns a gradient)."""

from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F
from check_reports import standard_tests

from course_lib.check.nb03 import accumulate, token_normalisation, uneven_weights
from course_lib.core import accumulation
from course_lib.lessons import pitfalls


def scaled_by(factor, zero_inside=False):
    """An accumulation that backwards each micro-batch's mean x factor(k)."""
    def my_accumulate(model, x, y, k):
        for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
            if zero_inside:
                model.zero_grad()
            (F.cross_entropy(model(xm), ym) * factor(k)).backward()
    return my_accumulate


def split_by_rows(model, x, y, k):  # right: tensor_split, each loss weighted by its rows
    for xm, ym in zip(x.tensor_split(k), y.tensor_split(k), strict=True):
        (F.cross_entropy(model(xm), ym, reduction="sum") / len(x)).backward()


def only_first(model, x, y, k):
    (F.cross_entropy(model(x.chunk(k)[0]), y.chunk(k)[0]) / k).backward()


def one_short(model, x, y, k):  # k - 1 micro-batches: none at all for k = 1
    for xm, ym in list(zip(x.chunk(k), y.chunk(k), strict=True))[:k - 1]:
        (F.cross_entropy(model(xm), ym) / k).backward()


def detached(model, x, y, k):
    for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
        (F.cross_entropy(model(xm), ym).detach() / k).backward()


NO_BACKWARD = "with accum_steps=1 no parameter has a .grad: no backward ran at all"


ACCUMULATE_MISTAKES = [
    (scaled_by(lambda k: 1), "your gradient points the right way but is 3 times too large"),
    (scaled_by(lambda k: 1 / k**2), "3 times too small"),
    (scaled_by(lambda k: 1 / k, zero_inside=True), "only the last micro-batch's share is left"),
    (only_first, "with accum_steps=3 your code ran the model 1 time, on [8] rows of the 24"),
    (lambda model, x, y, k: F.cross_entropy(model(x), y).backward(),  # accum_steps ignored
     "with accum_steps=3 your code ran the model 1 time, on [24] rows of the 24"),
    (lambda model, x, y, k: None, NO_BACKWARD),
    (one_short, NO_BACKWARD),
    (scaled_by(lambda k: 1 / 24), "with accum_steps=1 your gradient points the right way but is "
                                  "24 times too small: the loss you backward comes to more"),
    (lambda model, x, y, k: model.net[0].weight.sum().backward(),
     "some parameters have no .grad: no backward reached them"),
    (detached, "RuntimeError: element 0 of tensors does not require grad"),
    (lambda model, x, y, k: pitfalls.accumulate(model, x, y, k), "calls pitfalls.accumulate"),
]


MEAN_OF_MEANS = "this is a mean of micro-batch means"


TOKEN_MISTAKES = [
    (lambda loss_sum, micro, total, k: loss_sum / total / k,
     "3 times too small: the 3 losses you backward add up to 1/3 of the batch's mean"),
    (lambda loss_sum, micro, total, k: loss_sum / total * k, "3 times too large"),
    (lambda loss_sum, micro, total, k: loss_sum / micro / k, MEAN_OF_MEANS),
    (lambda loss_sum, micro, total, k: loss_sum / micro, "each micro-batch is a mean over its "
                                                         "own tokens, and the means are added"),
    (lambda loss_sum, micro, total, k: loss_sum, "points the right way but is"),
    (lambda loss_sum, micro, total, k: loss_sum / k, "points the right way but is"),
    (lambda loss_sum, micro, total, k: loss_sum.item() / total, "the plain number"),
    (lambda loss_sum, micro, total, k: loss_sum.detach() / total, "cut off from the model"),
    (lambda loss_sum, micro, total, k: torch.tensor(loss_sum.item() / total, requires_grad=True),
     "your tensor is a new one"),
    (lambda loss_sum, micro, total, k: accumulation.scale_by_global_tokens(loss_sum, total),
     "calls accumulation.scale_by_global_tokens"),
    (lambda loss_sum, micro, total, k: loss_sum / (total + micro), "not the big batch's gradient"),
]


EQUAL = "every micro-batch gets the same weight"


WEIGHT_MISTAKES = [
    (lambda sizes: [1 / len(sizes)] * len(sizes), EQUAL),
    (lambda sizes: [n / max(sizes) for n in sizes], "your weights add up to 2.5"),
    (lambda sizes: [n // sum(sizes) for n in sizes], "your weights are all 0"),
    (lambda sizes: [n / sum(sizes) for n in reversed(sizes)], "do not follow the sizes"),
    (lambda sizes: [1.0], "return one weight per micro-batch (3), not 1"),
    (lambda sizes: {n: n / sum(sizes) for n in sizes}, "one number each (a list, a tuple or a "
                                                       "1-D tensor); your code returned a dict"),
    (lambda sizes: [[n / sum(sizes)] for n in sizes], "for sizes [4, 4, 2] each weight should be "
                                                      "one number; one of yours is a list"),
    (lambda sizes: np.array(sizes)[:, None] / sum(sizes), "your code returned a numpy array of "
                                                          "shape (3, 1)"),
    (lambda sizes: [str(n / sum(sizes)) for n in sizes], "one of yours is the str '0.4'"),
]


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((accumulate, [scaled_by(lambda k: 1 / k), split_by_rows],
                    ACCUMULATE_MISTAKES),
                   (token_normalisation, [lambda loss_sum, micro, total, k: loss_sum / total],
                    TOKEN_MISTAKES),
                   (uneven_weights, [lambda sizes: [n / sum(sizes) for n in sizes],
                                     lambda sizes: torch.tensor(sizes) / sum(sizes),  # a tensor
                                     lambda sizes: np.array(sizes) / sum(sizes),  # numpy's
                                     lambda sizes: [np.float32(n / sum(sizes)) for n in sizes],
                                     lambda sizes: [Fraction(n, sum(sizes)) for n in sizes],
                                     lambda sizes: map(lambda n: n / sum(sizes), sizes)],
                    WEIGHT_MISTAKES, ("n_j / N", "sum(sizes)")))  # no formula given away
