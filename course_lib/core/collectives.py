"""All-reduce by hand, from point-to-point messages (notebook 06, all-reduce from scratch).

Each function takes one tensor per rank and leaves, in place, the SUM over all ranks in it on
every rank, then returns it. They move data only with ``send``/``recv``/``isend``/``irecv``:

- ``naive_all_reduce``: everyone sends to rank 0, which adds and sends the sum back.
- ``ring_all_reduce`` = ``ring_reduce_scatter`` + ``ring_all_gather``: N-1 steps each, one chunk
  to the right-hand neighbour per step; each rank sends 2(N-1)/N of the tensor.
- ``recursive_doubling_all_reduce``: log2(N) rounds of swapping whole tensors with rank XOR 2^k.

Any world size, shape (0-d, empty, fewer elements than ranks), non-contiguous tensors, float and
integer dtypes, Gloo or NCCL. Pass ``counter=ByteCounter()`` to count what this rank sends. The
pipelined version, with the same results, is ``course_lib/core/fast_ring.py``.

Every rank must pass a tensor of the same shape and dtype, as with ``dist.all_reduce``; if not,
a peer waits for bytes that never come. ``check=True`` makes sure first and raises a clear
``ValueError`` on every rank. It costs one more collective (a small all_gather) per call, which
in a sync of one all-reduce per parameter doubles the collectives; so it is off by default, as
torch's own check is (``TORCH_DISTRIBUTED_DEBUG=DETAIL``), and the data-parallel wrappers check
every parameter once, when built. (Remembering the shapes already checked would not do: a rank
that had seen its shape before would skip the check while a rank with a new one waited in it.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.core.messages import ByteCounter, done, recv, send, send_recv, start_collective

REDUCE_SCATTER, ALL_GATHER = "reduce-scatter", "all-gather"


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` of N contiguous chunks; the first ``numel % N`` get one more element."""
    if world_size < 1 or numel < 0:
        raise ValueError(f"chunk_bounds needs numel >= 0 and world_size >= 1, got "
                         f"numel={numel}, world_size={world_size}")
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for r in range(world_size):
        end = start + base + (1 if r < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def send_chunk(rank: int, step: int, world_size: int, phase: str) -> int:
    """The ring's schedule: the chunk ``rank`` sends to its right-hand neighbour at ``step``."""
    if phase == REDUCE_SCATTER:
        return (rank - step - 1) % world_size  # ends with rank r holding the sum of chunk r
    return (rank - step) % world_size  # all-gather: first the chunk I finished, then on


@torch.no_grad()
def naive_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                     counter: ByteCounter | None = None, check: bool = False) -> torch.Tensor:
    """Everyone sends to rank 0; rank 0 adds in rank order and sends the sum back."""
    rank, world_size, flat = start_collective(tensor, group, check)  # flat: (numel,)
    if world_size == 1 or flat.numel() == 0:
        return done(tensor, flat)
    if rank == 0:
        incoming = torch.empty_like(flat)
        for src in range(1, world_size):
            recv(incoming, src, group)
            flat += incoming  # always 0 + 1 + 2 + ...: the same sum on every rank
        for dst in range(1, world_size):
            send(flat, dst, group, counter)
    else:
        send(flat, 0, group, counter)
        recv(flat, 0, group)  # the sum, computed on rank 0
    return done(tensor, flat)


@torch.no_grad()
def ring_reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                        counter: ByteCounter | None = None, check: bool = False) -> torch.Tensor:
    """Afterwards rank r's chunk r (``chunk_bounds``) holds the sum over all ranks."""
    rank, world_size, flat = start_collective(tensor, group, check)  # flat: (numel,)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), world_size)]  # N x (~numel/N,)
    incoming = torch.empty_like(chunks[0])  # chunk 0 is the largest
    for step in range(world_size - 1):
        mine = send_chunk(rank, step, world_size, REDUCE_SCATTER)
        theirs = send_chunk(left, step, world_size, REDUCE_SCATTER)  # what my left sends me
        landing = incoming[:chunks[theirs].numel()]
        send_recv(chunks[mine], right, landing, left, group, counter)
        chunks[theirs] += landing  # my numbers + the partial sum travelling round the ring
    return done(tensor, flat)


@torch.no_grad()
def ring_all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    counter: ByteCounter | None = None, check: bool = False) -> torch.Tensor:
    """Rank r's chunk r is final; afterwards every rank holds every rank's final chunk."""
    rank, world_size, flat = start_collective(tensor, group, check)  # flat: (numel,)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), world_size)]
    for step in range(world_size - 1):
        mine = send_chunk(rank, step, world_size, ALL_GATHER)
        theirs = send_chunk(left, step, world_size, ALL_GATHER)
        send_recv(chunks[mine], right, chunks[theirs], left, group, counter)  # lands in place
    return done(tensor, flat)


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    counter: ByteCounter | None = None, check: bool = False) -> torch.Tensor:
    """Reduce-scatter, then all-gather, round the ring. In place; returns ``tensor``.
    ``check=True``: first make sure every rank passed the same shape and dtype, at the cost of
    one more collective (a small all_gather) in this call."""
    ring_reduce_scatter(tensor, group, counter, check)  # checked (when asked) once, here
    return ring_all_gather(tensor, group, counter)


@torch.no_grad()
def recursive_doubling_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                                  counter: ByteCounter | None = None,
                                  check: bool = False) -> torch.Tensor:
    """Swap and add with rank XOR 1, 2, 4, ...; extra ranks (N not a power of 2) fold in first."""
    rank, world_size, flat = start_collective(tensor, group, check)  # flat: (numel,)
    if world_size == 1 or flat.numel() == 0:
        return done(tensor, flat)
    power = 1 << (world_size.bit_length() - 1)  # the largest power of two <= N
    incoming = torch.empty_like(flat)
    if rank >= power:  # an extra rank: hand my tensor over, get the sum back at the end
        send(flat, rank - power, group, counter)
        recv(flat, rank - power, group)
        return done(tensor, flat)
    if rank + power < world_size:  # fold: my tensor + the extra rank's
        recv(incoming, rank + power, group)
        flat += incoming
    distance = 1
    while distance < power:  # after the round with distance d, blocks of 2d ranks agree
        partner = rank ^ distance
        send_recv(flat, partner, incoming, partner, group, counter)
        if rank < partner:
            flat += incoming  # lower rank's sum + higher rank's: the same order on both
        else:
            torch.add(incoming, flat, out=flat)
        distance *= 2
    if rank + power < world_size:  # unfold: the extra rank gets the final sum
        send(flat, rank + power, group, counter)
    return done(tensor, flat)
