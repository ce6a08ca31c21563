"""An all-reduce function that counts its calls and the bytes handed to it (notebooks 07-09).

    all_reduce = CountedAllReduce(dist.all_reduce)
    model = BucketedDataParallel(module, group, 25.0, all_reduce)   # any ``all_reduce=``
    ...                                                             # train
    all_reduce.calls, all_reduce.bytes                              # since construction

``python -m course_lib.train`` reports these numbers; ``course_lib.lessons.timeline``'s
``CommRecorder`` counts the same way and also times every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the annotations: counting itself never needs torch
    import torch
    import torch.distributed as dist


class CountedAllReduce:
    """Calls ``all_reduce`` and counts: use it wherever the wrappers take ``all_reduce=``."""

    def __init__(self, all_reduce) -> None:
        self.inner = all_reduce
        self.calls = 0  # all-reduces since construction
        self.bytes = 0  # bytes handed to them since construction

    def count(self, tensor: torch.Tensor) -> int:
        """Count one call with ``tensor``; returns its size in bytes."""
        nbytes = tensor.numel() * tensor.element_size()
        self.calls += 1
        self.bytes += nbytes
        return nbytes

    def __call__(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                 async_op: bool = False):
        self.count(tensor)
        if async_op:  # passed only when asked: the course's naive and ring all-reduces lack it
            return self.inner(tensor, group=group, async_op=True)
        return self.inner(tensor, group=group)
