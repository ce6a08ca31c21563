"""Checkers for the exercises of notebook 03 (gradient accumulation)."""

from __future__ import annotations

import functools

import torch

from course_lib.check.answers import as_number, as_numbers, call, expect_tensor_with_grad
from course_lib.check.checker import exercise, expect
from course_lib.check.own_work import call_own
from course_lib.core import accumulation
from course_lib.lessons import gradients, pitfalls
from course_lib.tasks import batching, models, sequences, toy

TINY = models.TransformerConfig(d_model=16, n_layers=1)  # small for speed


def scale_of(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """c when ``got`` is c x ``want`` (to 1e-6); else None: a gradient off by a factor only."""
    c = float(got.double() @ want.double() / (want.double() @ want.double()))
    return c if gradients.relative_error(got, c * want) <= 1e-6 else None


def the_losses(k: int) -> str:
    """``the 3 losses you backward add up`` (``the loss you backward comes`` for one)."""
    return "the loss you backward comes" if k == 1 else f"the {k} losses you backward add up"


def times(c: float) -> str:
    """``3 times too large`` or ``3 times too small`` for a factor c (3 or 1/3)."""
    return f"{c:.3g} times too large" if c > 1 else f"{1 / c:.3g} times too small"


@exercise("3.1")
def accumulate(my_accumulate) -> None:
    """``my_accumulate(model, x, y, accum_steps)`` leaves the big-batch gradient in ``.grad``."""
    model = toy.make_mlp(hidden=16, norm="layer", seed=1)
    x, y = toy.two_moons(24, seed=4)
    want = gradients.batch_grad(model, x, y)
    library = [pitfalls.accumulate, pitfalls.accumulated_grad, accumulation.accumulation_step,
               accumulation.scale_for_micro_steps]
    for k in (1, 3, 4):
        last = gradients.batch_grad(model, x.chunk(k)[-1], y.chunk(k)[-1]) / k
        model.zero_grad(set_to_none=True)
        sizes = []  # the rows of each forward the learner's code runs
        counting = model.register_forward_pre_hook(
            lambda m, args, sizes=sizes: sizes.append(len(args[0])))
        try:
            call_own(my_accumulate, model, x, y, k, library=library)
        finally:
            counting.remove()
        expect(any(p.grad is not None for p in model.parameters()),
               f"with accum_steps={k} no parameter has a .grad: no backward ran at all; "
               "check that your loop runs once for each of the accum_steps micro-batches")
        expect(all(p.grad is not None for p in model.parameters()),
               "some parameters have no .grad: no backward reached them")
        expect(len(sizes) == k and sum(sizes) == len(x),
               f"with accum_steps={k} your code ran the model {len(sizes)} time"
               f"{'s' if len(sizes) != 1 else ''}, on {sizes} rows of the {len(x)}: "
               f"accumulation runs it once per micro-batch, {k} times, each on its share of "
               "the batch")
        got = gradients.flat_grad(model)
        if gradients.relative_error(got, want) <= 1e-6:
            continue
        expect(k == 1 or gradients.relative_error(got, last) > 1e-5,
               f"with accum_steps={k} only the last micro-batch's share is left in .grad: "
               "something clears the gradients between micro-batches")
        c = scale_of(got, want)
        expect(c is None, f"with accum_steps={k} your gradient points the right way but is "
                          f"{times(c or 1)}: {the_losses(k)} to more or less than one mean "
                          "over the batch")
        expect(False, f"with accum_steps={k} .grad is not the big batch's gradient, nor a "
                      "multiple of it: some examples' share is missing or counted twice")


def _micro_batches(accum_steps: int):
    """A global batch with short answers first, so that its micro-batches hold different
    numbers of scored tokens, and its micro-batches."""
    batch = pitfalls.sorted_by_length(sequences.global_batch(1, 3, 24))
    return batch, batching.micro_batches_of_rank(batch, 0, 1, accum_steps)


def _accumulated(model, parts, loss_of) -> torch.Tensor:
    """The gradient left by backward of ``loss_of(loss_sum, part)`` for every micro-batch."""
    model.zero_grad(set_to_none=True)
    for part in parts:
        loss_of(accumulation.sum_token_loss(model(part.inputs), part.targets), part).backward()
    return gradients.flat_grad(model).clone()


@functools.cache
def _token_case():
    """The model, the batch, its 3 micro-batches, the big batch's gradient and the gradient of
    the micro-batches' own means added up: the same for every answer, so computed once."""
    model = models.make_transformer(TINY, seed=0, dtype=torch.float64)
    batch, parts = _micro_batches(accum_steps=3)
    model.zero_grad(set_to_none=True)
    accumulation.big_batch_backward(model, batch)
    want = gradients.flat_grad(model).clone()
    own_means = _accumulated(model, parts, lambda s, part: s / part.num_targets)
    return model, batch, parts, want, own_means


@exercise("3.2")
def token_normalisation(my_micro_loss) -> None:
    """``my_micro_loss(loss_sum, micro_tokens, global_tokens, accum_steps)``: what to backward."""
    model, batch, parts, want, own_means = _token_case()
    global_tokens, k = batch.num_targets, len(parts)

    def learners(loss_sum, part):
        loss = call_own(my_micro_loss, loss_sum, part.num_targets, global_tokens, k,
                        library=[accumulation.scale_by_global_tokens,
                                 accumulation.mean_of_micro_means])
        expect_tensor_with_grad(loss, "return the loss to call backward on, computed from "
                                      "loss_sum")
        expect(loss.dim() == 0, "return one number (a 0-dim tensor), not a tensor of shape "
                                f"{tuple(loss.shape)}")
        return loss

    got = _accumulated(model, parts, learners)
    if gradients.relative_error(got, want) <= 1e-9:
        return
    c = scale_of(got, want)
    expect(c is None or abs(c - k) > 1e-6,
           f"your gradient is {k} times too large: the {k} losses you backward should add up "
           "to ONE mean over all the batch's scored tokens, not to several")
    expect(c is None or abs(c - 1 / k) > 1e-6,
           f"your gradient is {k} times too small: {the_losses(k)} to 1/{k} of the "
           "batch's mean, so your denominator counts more than the batch's "
           "scored tokens")
    expect(c is None, f"your gradient points the right way but is {times(c or 1)}: the losses "
                      "you backward should add up to the mean over all the batch's scored "
                      "tokens")
    expect(gradients.relative_error(got, own_means / k) > 1e-9,
           "this is a mean of micro-batch means: each micro-batch divides by its own token "
           "count, so a token in a short micro-batch weighs more than one in a long one. "
           "Every token of the batch should weigh the same")
    expect(gradients.relative_error(got, own_means) > 1e-9,
           "each micro-batch is a mean over its own tokens, and the means are added up: "
           "too large, and a token in a short micro-batch weighs more than one in a long "
           "one. Every token of the batch should weigh the same")
    expect(False, "not the big batch's gradient: every scored token of the batch should weigh "
                  "the same in the sum of your losses")


@exercise("3.3")
def uneven_weights(my_weights) -> None:
    """``my_weights(sizes)``: the factor for each micro-batch's mean loss, e.g. [4, 4, 2]."""
    for sizes in ([4, 4, 2], [8], [5, 5, 5, 1], [3, 3]):
        got = as_numbers(call(my_weights, list(sizes)),
                         "return the weights in micro-batch order, one number each (a list, a "
                         "tuple or a 1-D tensor)")
        expect(len(got) == len(sizes), f"for sizes {sizes} return one weight per micro-batch "
                                       f"({len(sizes)}), not {len(got)}")
        got = [as_number(w, f"for sizes {sizes} each weight should be one number",
                         returned="one of yours is") for w in got]
        want = [s / sum(sizes) for s in sizes]
        if all(abs(g - w) < 1e-6 for g, w in zip(got, want, strict=True)):  # float32 is fine
            continue
        expect(any(got), f"for sizes {sizes} your weights are all 0: integer division (//) "
                         "rounds a fraction down to 0")
        expect(abs(sum(got) - 1) < 1e-6, f"for sizes {sizes} your weights add up to "
                                         f"{sum(got):.4g}; the weights of a mean add up to 1")
        expect(len(set(sizes)) == 1 or len(set(got)) > 1,
               f"for sizes {sizes} every micro-batch gets the same weight: right only when all "
               "micro-batches are the same size; a smaller one should count for less")
        expect(False, f"for sizes {sizes} your weights add up to 1 but do not follow the sizes: "
                      "a micro-batch's weight should grow with the examples it holds")
