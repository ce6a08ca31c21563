"""Notebook 03's checkers: the reference answers pass; realistic wrong answers (of the wrong
kind, detached, calling the course's own version, off by a factor, a mean of means) get the
hint that names their mistake, and only that one, in a short report without checker code.

Exercise 3.3 has no "calls the course's own version" case: no course function returns the
weights (the notebook's pitfalls.uneven_accumulated_grad returns a gradient)."""

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


def only_first(model, x, y, k):
    (F.cross_entropy(model(x.chunk(k)[0]), y.chunk(k)[0]) / k).backward()


def detached(model, x, y, k):
    for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
        (F.cross_entropy(model(xm), ym).detach() / k).backward()


ACCUMULATE_MISTAKES = [
    (scaled_by(lambda k: 1), "your gradient points the right way but is 3 times too large"),
    (scaled_by(lambda k: 1 / k**2), "3 times too small"),
    (scaled_by(lambda k: 1 / k, zero_inside=True), "only the last micro-batch's share is left"),
    (only_first, "some examples' share is missing or counted twice"),
    (lambda model, x, y, k: None, "some parameters have no .grad"),
    (detached, "RuntimeError: element 0 of tensors does not require grad"),
    (lambda model, x, y, k: pitfalls.accumulate(model, x, y, k), "calls pitfalls.accumulate"),
]


MEAN_OF_MEANS = "this is a mean of micro-batch means"


TOKEN_MISTAKES = [
    (lambda loss_sum, micro, total, k: loss_sum / total / k, "3 times too small"),
    (lambda loss_sum, micro, total, k: loss_sum / total * k, "3 times too large"),
    (lambda loss_sum, micro, total, k: loss_sum / micro / k, MEAN_OF_MEANS),
    (lambda loss_sum, micro, total, k: loss_sum / micro, "each micro-batch is a mean over its "
                                                         "own tokens, and the means are added"),
    (lambda loss_sum, micro, total, k: loss_sum, "points the right way but is"),
    (lambda loss_sum, micro, total, k: loss_sum / k, "points the right way but is"),
    (lambda loss_sum, micro, total, k: loss_sum.item() / total, "the plain number"),
    (lambda loss_sum, micro, total, k: loss_sum.detach() / total, "cut off from the model"),
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
    (lambda sizes: {n: n / sum(sizes) for n in sizes}, "return a list of weights, one number "
                                                       "per micro-batch; your code returned a "
                                                       "dict"),
    (lambda sizes: [[n / sum(sizes)] for n in sizes], "each weight should be one number; for "
                                                      "sizes [4, 4, 2] your list holds a list"),
]


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((accumulate, [scaled_by(lambda k: 1 / k)], ACCUMULATE_MISTAKES),
                   (token_normalisation, [lambda loss_sum, micro, total, k: loss_sum / total],
                    TOKEN_MISTAKES),
                   (uneven_weights, [lambda sizes: [n / sum(sizes) for n in sizes],
                                     lambda sizes: torch.tensor(sizes) / sum(sizes)],  # a tensor
                    WEIGHT_MISTAKES, ("n_j / N", "sum(sizes)")))  # no formula given away
