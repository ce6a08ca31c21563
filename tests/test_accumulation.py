"""Token-count normalisation equals the big batch; the mean of micro-batch means does not."""

import pytest
import torch

from course_lib.core.accumulation import (
    accumulate_gradients,
    all_reduce_token_count,
    big_batch_backward,
    count_target_tokens,
    mean_of_micro_means,
    scale_by_global_tokens,
    scale_for_micro_steps,
    sum_token_loss,
)
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import TransformerConfig, make_transformer
from course_lib.tasks.sequences import global_batch, sum_text, texts_to_batch

TINY = TransformerConfig(d_model=16, n_layers=1)  # small for test speed


def grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def reference_and_accumulated(dtype, normalisation, batch, accum_steps=4):
    model = make_transformer(TINY, seed=0, dtype=dtype)
    model.zero_grad()
    big_loss = big_batch_backward(model, batch)
    big = grads(model).clone()
    model.zero_grad()
    parts = micro_batches_of_rank(batch, 0, 1, accum_steps)
    loss = accumulate_gradients(model, parts, normalisation=normalisation)
    return big_loss, big, loss, grads(model).clone()


def relative_error(a, b):
    return float((a - b).norm() / b.norm())


def test_micro_batches_really_hold_different_token_counts():
    parts = micro_batches_of_rank(global_batch(0, 5, 32), 0, 1, 4)
    assert len({p.num_targets for p in parts}) > 1  # otherwise the bug below would hide


def test_token_normalisation_matches_the_big_batch_fp32():
    big_loss, big, loss, acc = reference_and_accumulated(torch.float32, "tokens",
                                                         global_batch(0, 5, 32))
    assert relative_error(acc, big) <= 1e-6
    torch.testing.assert_close(acc, big, rtol=1e-5, atol=1e-7)
    assert loss == pytest.approx(big_loss, rel=1e-5)


def test_token_normalisation_matches_the_big_batch_exactly_in_fp64():
    _, big, _, acc = reference_and_accumulated(torch.float64, "tokens", global_batch(0, 5, 32))
    torch.testing.assert_close(acc, big, rtol=1e-12, atol=1e-12)


def test_mean_of_micro_means_does_not_match():
    big_loss, big, loss, acc = reference_and_accumulated(torch.float64, "mean_of_means",
                                                         global_batch(0, 5, 32))
    assert relative_error(acc, big) > 1e-3  # far above rounding (1e-12 in fp64)
    assert abs(loss - big_loss) > 1e-4


def test_mean_of_micro_means_is_fine_when_every_micro_batch_has_equal_tokens():
    texts = [sum_text(a, 10 + a) for a in range(10, 26)]  # every answer has two digits
    batch = texts_to_batch(texts, max_digits=3)
    _, big, _, acc = reference_and_accumulated(torch.float64, "mean_of_means", batch)
    torch.testing.assert_close(acc, big, rtol=1e-12, atol=1e-12)


def test_world_size_scaling_with_averaging_gives_the_global_mean():
    """Two simulated ranks, two micro-steps each; the sync averages their gradients."""
    batch = global_batch(1, 0, 16)
    model = make_transformer(TINY, seed=0, dtype=torch.float64)
    model.zero_grad()
    big_batch_backward(model, batch)
    big = grads(model).clone()
    world = 2
    parts = [micro_batches_of_rank(batch, r, world, 2) for r in range(world)]
    counts = [sum(count_target_tokens(mb.targets) for mb in rank_parts) for rank_parts in parts]
    global_tokens = sum(counts)  # what the all-reduce of the counts gives
    per_rank = []
    for rank_parts in parts:
        model.zero_grad()
        for mb in rank_parts:
            loss_sum = sum_token_loss(model(mb.inputs), mb.targets)
            scale_by_global_tokens(loss_sum, global_tokens, world).backward()
        per_rank.append(grads(model).clone())
    averaged = sum(per_rank) / world  # what every sync strategy (and DDP) computes
    torch.testing.assert_close(averaged, big, rtol=1e-12, atol=1e-12)


def test_scale_for_micro_steps_on_equal_size_batches():
    torch.manual_seed(0)
    x, y = torch.randn(12, 3, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    ((x @ w - y) ** 2).mean().backward()
    big = w.grad.clone()
    w.grad = None
    for xs, ys in zip(x.split(4), y.split(4), strict=True):
        scale_for_micro_steps(((xs @ w - ys) ** 2).mean(), 3).backward()
    torch.testing.assert_close(w.grad, big, rtol=1e-12, atol=1e-12)
    w.grad = None
    for xs, ys in zip(x.split(4), y.split(4), strict=True):
        ((xs @ w - ys) ** 2).mean().backward()  # forgetting the scale: 3 x too large
    torch.testing.assert_close(w.grad, 3 * big, rtol=1e-12, atol=1e-12)


def test_small_helpers():
    targets = torch.tensor([[1, -100, 2], [-100, -100, 3]])
    count = count_target_tokens(targets)
    assert count.dtype == torch.int64 and int(count) == 3
    total = all_reduce_token_count(count)  # no process group: already global
    assert int(total) == 3 and total is not count
    assert float(mean_of_micro_means(torch.tensor(6.0), 3, 2)) == 1.0
    with pytest.raises(ValueError, match="unknown normalisation"):
        accumulate_gradients(make_transformer(TINY), [], normalisation="mean")
