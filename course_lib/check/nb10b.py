"""Checkers for the exercises of notebook 10b (sharding everything: ZeRO-2 and ZeRO-3)."""

from __future__ import annotations

import torch

from course_lib.check.answers import call, expect_type
from course_lib.check.checker import exercise, expect

SIZES = ((2, 7), (4, 33), (8, 300))  # (ranks, values per gradient)


def messages_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    """What every rank holds: the bf16 messages, added in fp32, divided by the ranks."""
    return torch.stack([g.to(torch.bfloat16).float() for g in grads]).sum(0) / len(grads)


def bf16_sum_mean(grads: list[torch.Tensor]) -> torch.Tensor:
    """The messages added up in bf16: rounded again at every addition."""
    total = grads[0].to(torch.bfloat16)
    for g in grads[1:]:
        total = total + g.to(torch.bfloat16)
    return total.float() / len(grads)


def gradients(world_size: int, numel: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(world_size * 1000 + numel)
    scale = torch.logspace(-6, 2, numel)  # small and large values: bf16 keeps their range
    return [torch.randn(numel, generator=g) * scale for _ in range(world_size)]


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, rtol=1e-6, atol=0)


@exercise("10.5")
def compressed_mean(mean_of_messages) -> None:
    """``mean_of_messages(grads)``: every rank's fp32 gradient -> the fp32 mean of their bf16
    messages, as a bf16 all-reduce leaves it in ``.grad``."""
    for world_size, numel in SIZES:
        grads = gradients(world_size, numel)
        kept = [g.clone() for g in grads]
        got = call(mean_of_messages, [g.clone() for g in grads])
        expect_type(got, torch.Tensor, "return one tensor: the mean gradient")
        expect(got.shape == grads[0].shape, f"{world_size} gradients of {numel} values: return "
                                            f"{numel} values, got shape {tuple(got.shape)}")
        expect(got.dtype == torch.float32,
               f"your mean is {got.dtype}: the message is bf16, but .grad, gradient "
               "accumulation and the optimizer stay float32")
        want = messages_mean(kept)
        if same(got, want):
            continue
        expect(not same(got, want * world_size),
               f"{world_size} ranks: your values are {world_size} times the mean, the sum of "
               "the messages; data parallelism steps with the mean")
        expect(not same(got, torch.stack(kept).mean(0)),
               "your mean has no bf16 rounding at all: the gradients never went through the "
               "2-byte type, so the message was not compressed")
        expect(not same(got, bf16_sum_mean(kept)),
               f"{world_size} ranks: your mean is rounded once more at every addition: the "
               "messages were added up in bf16, where each sum keeps 8 significant bits")
        worst = float(((got - want).abs() / want.abs().clamp_min(1e-30)).max())
        expect(False, f"{world_size} ranks of {numel} values: off by up to {worst:.1e} "
                      "relative from the mean of the bf16 messages added in float32")
