"""A model changed after it was wrapped, found at the next forward (notebooks 07, 08, 10b).

A wrapper makes what it needs for the model as it is: buckets of the parameters' dtype and
device, hooks on the trained parameters, flat shards. A change after that (``model.double()``,
``requires_grad_(False)``, a new layer) would leave gradients rounded, unsynced, or stepped where
nothing should be, without a sound. So each wrapper keeps the model's layout when it is built
and compares it at each forward: a list comparison, no collective.

    layout = layout_of(module.named_parameters())              # when wrapping
    change = what_changed(layout, module.named_parameters())   # at each forward: '' or words
    if change:
        raise changed_after_wrapping("OverlapDataParallel", change)
"""

from __future__ import annotations

from typing import Iterable

import torch


def layout_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple]:
    """What a wrapper is built for: each parameter's name, identity, dtype, device, and whether
    it is trained. Compared at each forward: a list comparison, no collective."""
    return [(name, id(t), t.dtype, t.device, t.requires_grad) for name, t in named]


def what_changed(before: list[tuple], named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """'' when ``named`` still has the layout ``before``; else the first change and what it
    would do, in words."""
    after = layout_of(named)
    if after == before:
        return ""
    now = {entry[0]: entry for entry in after}
    for name, ident, dtype, device, trained in before:
        if name not in now or now[name][1] != ident:
            return f"parameter {name!r} was replaced: its gradient would never be averaged"
        if now[name][2:4] != (dtype, device):
            new_dtype, new_device = now[name][2:4]
            return (f"parameter {name!r} was {dtype} on {device} and is {new_dtype} on "
                    f"{new_device} now: its gradient would go through what was made for the "
                    "old one (rounded to the old dtype, or refused)")
        if now[name][4] != trained:
            return (f"parameter {name!r} was frozen (requires_grad_(False)): it would still "
                    "get a gradient, which the optimizer acts on (even zeros move it through "
                    "momentum and weight decay)"
                    if trained else f"parameter {name!r} was unfrozen: its gradient would "
                    "never be averaged, and the replicas would drift apart")
    new = next(name for name in now if name not in {entry[0] for entry in before})
    return f"parameter {new!r} is new: its gradient would never be averaged"


def changed_after_wrapping(wrapper: str, change: str) -> RuntimeError:
    return RuntimeError(f"{wrapper}: the model changed after it was wrapped: {change}. Make "
                        "every change first (model.to(dtype or device), requires_grad_(), new "
                        "layers), then wrap the model")
