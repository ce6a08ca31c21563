"""Gradients sent in bf16, kept in fp32: half the bytes of every all-reduce (notebook 10).

An all-reduce costs time in proportion to the bytes it moves. bf16 keeps fp32's 8-bit exponent
(the same range: a sum of gradients cannot overflow) and 8 of its 24 significant bits: each
value sent is rounded to a relative error of at most 2^-8 (0.4%), and the sum over N ranks is
rounded again as it travels. Only the message is bf16: ``.grad``, the accumulation of
micro-batches and the optimizer stay fp32. This is what torch DDP's ``bf16_compress_hook``
(``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``) does.

    model = OverlapDataParallel(module, process_group=group, all_reduce=bf16_all_reduce)
    ddp_model.register_comm_hook(group, bf16_comm_hook)              # torch DDP

``bf16_all_reduce`` is a drop-in ``all_reduce=`` for the course's wrappers: it leaves the SUM
in place in the fp32 tensor (the wrappers divide by N afterwards), and takes ``async_op=True``.
``bf16_comm_hook`` is a DDP communication hook: DDP expects the MEAN back, so it divides by N
before sending, as torch's hook does. Its name differs from torch's on purpose: DDP refuses a
hook named ``bf16_compress_hook`` unless CUDA and NCCL are there, though Gloo sums bf16 fine.
DDP also reads the hook's annotations, so this module keeps them as real types (no
``from __future__ import annotations``).
"""

import torch
import torch.distributed as dist

from course_lib.core.messages import ByteCounter


class Decompress:
    """The handle of a bf16 all-reduce: ``wait()`` copies the sum back into the fp32 tensor."""

    def __init__(self, work, compressed: torch.Tensor, tensor: torch.Tensor):
        self.work, self.compressed, self.tensor = work, compressed, tensor

    def wait(self) -> bool:
        self.work.wait()  # the bf16 sum is in compressed now
        self.tensor.copy_(self.compressed)  # rounded to bf16 on the way, fp32 from here on
        return True


def bf16_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    async_op: bool = False,
                    counter: ByteCounter | None = None) -> Decompress | None:
    """All-reduce ``tensor`` (fp32) as bf16: the sum, in place. With ``async_op``, returns a
    handle whose ``wait()`` finishes it. ``counter`` counts the bytes handed to the
    all-reduce: half of the fp32 tensor's."""
    compressed = tensor.detach().to(torch.bfloat16)  # same shape, 2 bytes per value
    if counter is not None:
        counter.add(compressed)
    work = dist.all_reduce(compressed, group=group, async_op=True)
    handle = Decompress(work, compressed, tensor)
    if async_op:
        return handle
    handle.wait()
    return None


def bf16_comm_hook(process_group: dist.ProcessGroup | None,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: ``ddp_model.register_comm_hook(process_group, this)``."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()  # (numel,) fp32: DDP's flat bucket of local gradients
    compressed = buffer.to(torch.bfloat16).div_(group.size())  # the mean is what DDP wants
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(done.value()[0])  # in place: no second fp32 bucket
        return buffer

    return future.then(decompress)
