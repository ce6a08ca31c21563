"""Checkers for the exercises of notebook 03 (gradient accumulation)."""

from __future__ import annotations

import torch

from course_lib.check.core import exercise, expect
from course_lib.core import accumulation
from course_lib.lessons import gradients, pitfalls
from course_lib.tasks import batching, models, sequences, toy

TINY = models.TransformerConfig(d_model=16, n_layers=1)  # small for speed


@exercise("3.1")
def accumulate(my_accumulate) -> None:
    """``my_accumulate(model, x, y, accum_steps)`` leaves the big-batch gradient in ``.grad``."""
    model = toy.make_mlp(hidden=16, norm="layer", seed=1)
    x, y = toy.two_moons(24, seed=4)
    want = gradients.batch_grad(model, x, y)
    for k in (1, 3, 4):
        model.zero_grad(set_to_none=True)
        my_accumulate(model, x, y, k)
        expect(all(p.grad is not None for p in model.parameters()),
               "some parameters have no .grad: call backward on every micro-batch's loss")
        got = gradients.flat_grad(model)
        expect(not (k > 1 and torch.allclose(got, k * want, rtol=1e-4, atol=1e-6)),
               f"with accum_steps={k} your gradient is {k} times too large: divide each "
               "micro-batch's loss by accum_steps")
        expect(gradients.relative_error(got, want) <= 1e-6,
               f"with accum_steps={k} .grad is not the big batch's gradient: zero the grads "
               "once, before the loop (not inside it), and backward every micro-batch's "
               "loss / accum_steps, in order")


def _micro_batches(accum_steps: int):
    """A global batch with short answers first, so that its micro-batches hold different
    numbers of scored tokens, and its micro-batches."""
    batch = pitfalls.sorted_by_length(sequences.global_batch(1, 3, 24))
    return batch, batching.micro_batches_of_rank(batch, 0, 1, accum_steps)


@exercise("3.2")
def token_normalisation(my_micro_loss) -> None:
    """``my_micro_loss(loss_sum, micro_tokens, global_tokens, accum_steps)``: what to backward."""
    model = models.make_transformer(TINY, seed=0, dtype=torch.float64)
    batch, parts = _micro_batches(accum_steps=3)
    global_tokens = batch.num_targets
    model.zero_grad(set_to_none=True)
    accumulation.big_batch_backward(model, batch)
    want = gradients.flat_grad(model).clone()
    model.zero_grad(set_to_none=True)
    for part in parts:
        loss_sum = accumulation.sum_token_loss(model(part.inputs), part.targets)
        loss = my_micro_loss(loss_sum, part.num_targets, global_tokens, len(parts))
        expect(torch.is_tensor(loss) and loss.requires_grad,
               "return a tensor computed from loss_sum, so that backward reaches the model")
        loss.backward()
    got = gradients.flat_grad(model)
    k = len(parts)
    expect(gradients.relative_error(got, k * want) > 0.25,
           f"your gradient is about {k} times too large: the {k} micro-batch losses must add "
           "up to ONE mean over all the batch's tokens. Divide by the global token count")
    expect(gradients.relative_error(got, want) <= 1e-9,
           "not the big batch's gradient. Dividing each micro-batch by its own token count (a "
           "mean of micro-batch means) gives short micro-batches' tokens more weight: divide "
           "loss_sum by global_tokens, the same number for every micro-batch")


@exercise("3.3")
def uneven_weights(my_weights) -> None:
    """``my_weights(sizes)``: the factor for each micro-batch's mean loss, e.g. [4, 4, 2]."""
    for sizes in ([4, 4, 2], [8], [5, 5, 5, 1], [3, 3]):
        got = [float(w) for w in my_weights(list(sizes))]
        want = [s / sum(sizes) for s in sizes]
        expect(len(got) == len(sizes), f"return one weight per micro-batch ({len(sizes)})")
        expect(abs(sum(got) - 1) < 1e-12, f"for sizes {sizes} the weights add up to "
                                          f"{sum(got):.4g}; weights of a mean add up to 1")
        expect(all(abs(g - w) < 1e-12 for g, w in zip(got, want, strict=True)),
               f"for sizes {sizes} expected {[round(w, 4) for w in want]}: 1 / k is right "
               "only when all micro-batches are the same size; weigh each by its share of "
               "the examples, n_j / N")
