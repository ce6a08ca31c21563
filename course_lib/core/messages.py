"""The messages under the hand-written collectives (notebook 06): send, receive, count.

- ``send``/``recv``: one blocking message; ``send_recv``: send one tensor and receive another at
  the same time (the ring's step: every rank does both, so nobody waits for anybody).
- ``ByteCounter``: what a rank sent, to check the 2(N-1)/N law.
- ``check_same_shapes``: every rank must pass alike tensors, or a peer waits for ever; one small
  all-gather makes sure (the collectives do it when asked, the wrappers once when built).
- ``flat_work``/``done``: the algorithms work on a contiguous 1-D view, copied back if needed;
  ``start_collective`` is how each of them begins (rank, size, that view, the check if asked).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist


@dataclass
class ByteCounter:
    """What one rank sent: ``add`` is called with each tensor just before it is sent."""

    bytes_sent: int = 0
    messages: int = 0

    def add(self, tensor: torch.Tensor) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.messages += 1


def rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size."""
    if not dist.is_initialized():
        raise RuntimeError("no process group: call these functions inside "
                           "`with course_lib.runtime.worker.worker() as w:` in a launched file")
    return dist.get_rank(group), dist.get_world_size(group)


def send(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup | None,
         counter: ByteCounter | None = None) -> None:
    """Blocking send of ``tensor`` to rank ``dst`` of ``group``."""
    if counter is not None:
        counter.add(tensor)
    dist.send(tensor, group=group, group_dst=dst)


def recv(tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None) -> None:
    """Blocking receive into ``tensor`` from rank ``src`` of ``group``."""
    dist.recv(tensor, group=group, group_src=src)


def send_recv(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int,
              group: dist.ProcessGroup | None, counter: ByteCounter | None = None) -> None:
    """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``, both at once; wait."""
    ops = []
    if recv.numel() > 0:  # both ends know the sizes: empty chunks are simply not sent
        ops.append(dist.P2POp(dist.irecv, recv, group=group, group_peer=src))
    if send.numel() > 0:
        ops.append(dist.P2POp(dist.isend, send, group=group, group_peer=dst))
        if counter is not None:
            counter.add(send)
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


def check_same_shape(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Raise ``ValueError`` on every rank unless every rank passed the same shape and dtype."""
    check_same_shapes([tensor], group, "Every rank must pass a tensor of the same shape and dtype")


def check_same_shapes(tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None,
                      fix: str) -> None:
    """Every rank must pass tensors of the same shapes and dtypes, in the same order, or a peer
    would wait for bytes that never come. A safety check, not part of the algorithms, so it uses
    torch's all_gather: each rank shares one number that differs when a shape or dtype differs.
    Costs one small all_gather (one more when they differ, to name the difference)."""
    world_size = rank_and_size(group)[1]
    described = [f"shape {tuple(t.shape)} and {t.dtype}" for t in tensors]
    device = tensors[0].device if tensors else torch.device("cpu")
    mine = torch.tensor([zlib.crc32("; ".join(described).encode())], device=device)  # (1,)
    every = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine, group=group)
    if any(not torch.equal(other, every[0]) for other in every):  # every rank sees it alike
        told = [None] * world_size
        dist.all_gather_object(told, described, group=group)  # now the words, for the error
        raise ValueError(f"the ranks passed different tensors: {first_difference(told)}. {fix}")


def first_difference(told: list[list[str]]) -> str:
    """Where the ranks' descriptions first differ, in words: what each rank has there."""
    if len({len(t) for t in told}) > 1:
        return "; ".join(f"rank {r} has {len(t)} tensors" for r, t in enumerate(told))
    i = next(i for i in range(len(told[0])) if len({t[i] for t in told}) > 1)
    where = f"tensor {i}: " if len(told[0]) > 1 else ""
    return where + "; ".join(f"rank {r} has {t[i]}" for r, t in enumerate(told))


def flat_work(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor to work in: ``tensor`` itself, or a copy to copy back after."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def done(tensor: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Copy the result back if the work was done in a contiguous copy; return ``tensor``."""
    if not tensor.is_contiguous():
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def start_collective(tensor: torch.Tensor, group: dist.ProcessGroup | None,
                     check: bool) -> tuple[int, int, torch.Tensor]:
    """How every hand-written collective begins: this rank, the group's size, and the
    contiguous 1-D view of ``tensor`` to work on, (numel,). With ``check``, first one small
    all_gather that makes sure every rank passed the same shape and dtype: one collective more
    per call, so only when asked."""
    rank, world_size = rank_and_size(group)
    if check:
        check_same_shape(tensor, group)
    return rank, world_size, flat_work(tensor)
