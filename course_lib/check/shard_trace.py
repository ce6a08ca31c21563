"""Shards that notice when they are put together (exercise 10.3).

    shards, log = traced_shards([torch.randn(5), torch.randn(7)])
    answer(shards)
    log.mixed  # e.g. ["cat"]: an operation that took values of two shards, not single numbers

Each rank of a ZeRO run holds only its own chunk of the gradient, so an answer may combine
ONE number per rank (its chunk's sum of squares), never the chunks themselves. A traced shard
is a tensor subclass; everything computed from it remembers which shards it came from, and an
operation that takes inputs from two or more shards is noted when one of them holds more than
one number (``torch.cat(shards)``, ``shards[0] + shards[1]``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten


@dataclass
class MixLog:
    mixed: list = field(default_factory=list)  # names of the operations that mixed shards


class TracedShard(torch.Tensor):
    origins: frozenset = frozenset()  # the shards it was computed from
    raw: bool = True  # it still holds several values of a shard (not one number per shard)
    log: MixLog | None = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        traced = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TracedShard)]
        origins = frozenset().union(*(x.origins for x in traced))
        with torch._C.DisableTorchFunctionSubclass():
            raw = any(x.raw and x.numel() > 1 for x in traced)
            if len(origins) > 1 and raw:
                traced[0].log.mixed.append(getattr(func, "__name__", str(func)))
            out = func(*args, **kwargs)
        log = traced[0].log if traced else None
        return _tag(out, origins, log, raw)


def _tag(value, origins: frozenset, log, raw: bool):
    if isinstance(value, (list, tuple)):
        return type(value)(_tag(v, origins, log, raw) for v in value)
    if isinstance(value, torch.Tensor):
        tagged = value if isinstance(value, TracedShard) else value.as_subclass(TracedShard)
        with torch._C.DisableTorchFunctionSubclass():
            tagged.raw = raw and value.numel() > 1  # one number per shard is what may mix
        tagged.origins, tagged.log = tagged.origins | origins, log
        return tagged
    return value


def traced_shards(shards: list[torch.Tensor]) -> tuple[list[TracedShard], MixLog]:
    log = MixLog()
    return [_tag(s.clone(), frozenset([i]), log, True) for i, s in enumerate(shards)], log
