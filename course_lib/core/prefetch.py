"""Prefetching: the next module's all-gather runs while this one computes (notebook 10).

``fully_shard`` (fully_shard.py) gathers a module's parameters when the module is about to
compute and waits for them: the communication sits on the critical path, once per module in
forward and again in backward. The order of the modules is the same every step, so after the
first step we know which module comes next, and can start its all-gather early:

    forward   module i starts: wait for its own gather (launched earlier), launch module i+1's
    backward  module i's backward starts: wait for its own, launch the next one's in backward

``dist.all_gather_single(..., async_op=True)`` returns at once with a handle; Gloo runs the
collective on its own thread while this one computes (NCCL on its own stream); a module waits
for its own handle before it computes (``FlatShard.wait_for_unshard``). The orders are recorded
at the first step (forward: the order of the pre-hooks; backward: the reverse order of the
post-hooks, the root first). The price: two modules are whole at once instead of one.

    from course_lib.core.prefetch import fully_shard     # instead of core.fully_shard's
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from course_lib.core import fully_shard as plain
from course_lib.core.flat_shard import FlatShard


class Schedule:
    """The modules of one root in the order of their forward and of their backward, recorded
    at the first step (a module used twice is in them twice)."""

    def __init__(self) -> None:
        self.forward: list[PrefetchingShard] = []  # the pre-forward hooks' order
        self.backward: list[PrefetchingShard] = []  # the post-forward hooks' order, reversed
        self.recorded = False  # True once the first backward starts: the forward is over
        self.calls = 0  # pre-forward hooks so far in this forward


class PrefetchingShard(FlatShard):
    """A flat shard whose all-gather another module may start early."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = Schedule()  # the root's, once the root is wrapped
        self.reduced = False  # from its backward's end to the next forward: do not prefetch it

    def prefetch(self, state: PrefetchingShard | None) -> None:
        if state is not None and state.pending is None and not state.is_unsharded():
            state.pending = state.unshard(async_op=True)  # returns at once

    def before_forward(self) -> None:
        self.reduced = False
        super().before_forward()  # waits for my own prefetch, if there was one
        schedule = self.schedule
        if not schedule.recorded:
            schedule.forward.append(self)
            return
        if self is schedule.forward[0]:
            schedule.calls = 0  # the first module to start: a new forward
        schedule.calls += 1
        if schedule.calls < len(schedule.forward):
            self.prefetch(schedule.forward[schedule.calls])  # the module that comes next

    def after_forward(self, reshard: bool) -> None:
        super().after_forward(reshard)
        if not self.schedule.recorded:
            self.schedule.backward.insert(0, self)  # the root, last here, is first in backward

    def before_backward(self) -> None:
        super().before_backward()
        self.schedule.recorded = True
        order = self.schedule.backward
        later = order[order.index(self) + 1:] if self in order else []
        self.prefetch(next((s for s in later if not s.reduced), None))  # not done this step

    def gradient_done(self, full) -> None:
        super().gradient_done(full)
        self.reduced = True  # reduced, or kept while gradient sync is off


def fully_shard(module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """``core.fully_shard.fully_shard`` with prefetching; wrap the root last, as there."""
    plain.shard_module(module, PrefetchingShard, process_group, reshard_after_forward,
                       mp_policy)
    schedule = Schedule()  # one for the modules under this one: the root's wins
    for inner in module.modules():
        if isinstance(getattr(inner, "shard_state", None), PrefetchingShard):
            inner.shard_state.schedule = schedule
    return module
