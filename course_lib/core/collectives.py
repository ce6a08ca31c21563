"""All-reduce built by hand from point-to-point messages (notebook 06, all-reduce from scratch).

Every function here takes one tensor per rank and, in place, leaves the SUM over all ranks in
it on every rank (bitwise the same everywhere), then returns it. They use only
``isend``/``irecv`` (paired by ``batch_isend_irecv`` where NCCL needs it), never
``dist.all_reduce``:

- ``naive_all_reduce``: every rank sends its whole tensor to rank 0, which adds them up in rank
  order and sends the sum back. Rank 0 sends and receives (N-1) whole tensors: it is the
  bottleneck, and the time grows with N.
- ``ring_all_reduce``: the flat tensor is cut into N chunks (``chunk_bounds``). In N-1 steps of
  ``ring_reduce_scatter`` each rank passes one chunk to its right-hand neighbour and adds the
  chunk coming from its left; afterwards rank r's chunk r holds the full sum. In N-1 steps of
  ``ring_all_gather`` each finished chunk travels once round the ring. Each rank sends
  2(N-1)/N of the tensor's bytes whatever N is: the bandwidth-optimal all-reduce.
- ``recursive_doubling_all_reduce``: in round k, rank r swaps its whole (partial) sum with rank
  r XOR 2^k and adds: log2(N) rounds, so few messages (good for small tensors) but each rank
  sends log2(N) whole tensors. A world size that is not a power of two first folds the extra
  ranks into the first ones, and unfolds them at the end.

Any world size (1 is a no-op), any shape (0-d, empty, fewer elements than ranks, sizes not
divisible by N), non-contiguous tensors (the work is done in a contiguous copy, copied back),
float and integer dtypes, CPU tensors under Gloo and GPU tensors under NCCL (nothing here
assumes a device). Ranks that pass different shapes or dtypes all get a ``ValueError`` that
names both (``course_lib.core.collectives_p2p``) instead of a hang; ``check=False`` skips that
check when every rank surely passes alike tensors, saving a round of tiny messages per call.

Pass ``counter=ByteCounter()`` to count what this rank sends; the shape check's few bytes are
not counted. The ring is pipelined: each chunk travels as slices of at most ``slice_bytes``
(4 MB), up to ``PIPELINE_DEPTH`` slices are on the wire while one is added, and
``ring_all_reduce`` runs both halves as one stream of messages. Slices are large because
each message has a fixed cost (a Python call, a Gloo handshake, a thread wake-up) that small
slices would pay too often on a small CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.core.collectives_p2p import (
    ByteCounter,
    Peers,
    check_same_signature,
    check_tensor,
    receive_buffer,
    resolve_group,
    start_messages,
    wait_all,
)

__all__ = ["ByteCounter", "chunk_bounds", "naive_all_reduce", "recursive_doubling_all_reduce",
           "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]

SLICE_BYTES = 4 << 20  # the ring sends each chunk as slices of at most this many bytes
PIPELINE_DEPTH = 2  # ring slices in flight while one is added


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, end)] * world_size``: contiguous chunks of a flat tensor, chunk r for rank r.

    The first ``numel % world_size`` chunks get one element more (as ``torch.tensor_split``);
    with fewer elements than ranks the last chunks are empty.
    """
    if world_size < 1 or numel < 0:
        raise ValueError(f"chunk_bounds needs numel >= 0 and world_size >= 1, got "
                         f"numel={numel}, world_size={world_size}")
    base, extra = divmod(numel, world_size)  # every chunk gets base; the first `extra` one more
    bounds, start = [], 0
    for r in range(world_size):
        end = start + base + (1 if r < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _in_place(name: str, tensor: torch.Tensor, group=None, counter=None, *, algorithm,
              check: bool = True, batch: bool | None = None, **options):
    """Check the inputs, run ``algorithm(flat, peers)`` on a contiguous 1-D view, copy back.

    ``check``: first make sure every rank passed the same shape and dtype (one round of tiny
    messages). ``batch``: send pairs with ``batch_isend_irecv`` (None: where NCCL needs it).
    """
    check_tensor(tensor, name)
    group, rank, world_size = resolve_group(group)
    if world_size == 1:
        return tensor  # the sum over one rank is the tensor itself
    if batch is None:
        batch = dist.get_backend(group) != "gloo"
    peers = Peers(group, rank, world_size, counter, batch)
    if check:
        check_same_signature(tensor, peers, name)  # the same ValueError on every rank, or none
    with torch.no_grad():
        contiguous = tensor.is_contiguous()
        flat = tensor.view(-1) if contiguous else tensor.contiguous().view(-1)  # (numel,)
        if flat.numel() > 0:
            algorithm(flat, peers, **options)
        if not contiguous:
            tensor.copy_(flat.view(tensor.shape))
    return tensor


def naive_all_reduce(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                     *, check: bool = True):
    """Gather every tensor on rank 0, add them there, send the sum back. In place; returns it."""
    return _in_place("naive_all_reduce", tensor, group, counter, algorithm=_naive, check=check)


def _naive(flat: torch.Tensor, peers: Peers) -> None:
    if peers.rank != 0:
        wait_all(start_messages(peers, send=(flat, 0)))
        wait_all(start_messages(peers, recv=(flat, 0)))  # the sum, computed on rank 0
        return
    incoming = receive_buffer(flat.numel(), flat)  # (numel,) one other rank's tensor at a time
    for src in range(1, peers.world_size):
        wait_all(start_messages(peers, recv=(incoming, src)))
        flat.add_(incoming)  # always in rank order: 0 + 1 + 2 + ...
    works = []
    for dst in range(1, peers.world_size):
        works += start_messages(peers, send=(flat, dst))
    wait_all(works)


def ring_all_reduce(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                    *, slice_bytes: int = SLICE_BYTES, check: bool = True):
    """Reduce-scatter then all-gather round a ring. In place; returns ``tensor``.

    ``check=False`` skips the shape and dtype check: only when every rank surely passes alike
    tensors (it saves one round of tiny messages per call).
    """
    return _in_place("ring_all_reduce", tensor, group, counter, algorithm=_ring_all_reduce,
                     slice_bytes=slice_bytes, check=check)


def ring_reduce_scatter(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                        *, slice_bytes: int = SLICE_BYTES, check: bool = True):
    """Afterwards chunk r (``chunk_bounds``) of ``tensor.view(-1)`` on rank r holds the full sum.

    The other chunks hold partial sums. In place; returns ``tensor``.
    """
    return _in_place("ring_reduce_scatter", tensor, group, counter, algorithm=_reduce_scatter,
                     slice_bytes=slice_bytes, check=check)


def ring_all_gather(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                    *, slice_bytes: int = SLICE_BYTES, check: bool = True):
    """Rank r's chunk r is final; fill every other chunk from its owner. In place; returns it."""
    return _in_place("ring_all_gather", tensor, group, counter, algorithm=_all_gather,
                     slice_bytes=slice_bytes, check=check)


@dataclass(frozen=True)
class RingUnit:
    """One message of the ring: a slice goes right while the matching one comes from the left."""

    send: torch.Tensor  # (slice,) view into the flat tensor, sent to the right-hand neighbour
    recv: torch.Tensor  # (slice,) view into the flat tensor that the incoming slice is for
    add: bool  # reduce-scatter: add the incoming slice into recv; all-gather: it lands in recv


def _ring_units(flat: torch.Tensor, peers: Peers, slice_bytes: int, reduce: bool):
    """The ring's messages in order, and how many slices each chunk is cut into.

    Reduce-scatter (``reduce``): at step s rank r sends chunk r-s-1 and adds the incoming chunk
    r-s-2 into its own copy; after step N-2 its chunk r holds every rank's contribution.
    All-gather: at step s rank r sends chunk r-s (its own first) and receives chunk r-s-1.
    Every chunk is cut into the same number of slices, so both ends agree on each size.
    """
    n, r = peers.world_size, peers.rank
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]  # N x (numel/N,)
    biggest = chunks[0].numel() * flat.element_size()
    num_slices = max(1, -(-biggest // max(1, slice_bytes)))  # ceil: slices per chunk
    sliced = [[c[a:b] for a, b in chunk_bounds(c.numel(), num_slices)] for c in chunks]
    first = 1 if reduce else 0
    units = []
    for step in range(n - 1):
        send_chunk = (r - step - first) % n
        recv_chunk = (send_chunk - 1) % n  # the left neighbour sends the chunk before mine
        units += [RingUnit(send, recv, reduce) for send, recv
                  in zip(sliced[send_chunk], sliced[recv_chunk], strict=True)]
    return units, num_slices


def _run_ring(units: list[RingUnit], num_slices: int, flat: torch.Tensor, peers: Peers) -> None:
    """Send and receive every unit in order, keeping a few ahead while one is added.

    A unit sends a slice that was received (and added) ``num_slices`` units earlier, so the
    pipeline never runs further ahead than that.
    """
    right, left = (peers.rank + 1) % peers.world_size, (peers.rank - 1) % peers.world_size
    depth = min(PIPELINE_DEPTH, num_slices - 1)
    longest = max((u.recv.numel() for u in units if u.add), default=0)
    spare = receive_buffer((depth + 1) * longest, flat).view(depth + 1, longest)
    started = []  # (works, where the incoming slice lands) per unit, in order
    for i, unit in enumerate(units):
        while len(started) < min(i + depth + 1, len(units)):  # keep `depth` units ahead
            j, ahead = len(started), units[len(started)]
            # a slice to add lands in a spare buffer, free again since unit j - depth - 1
            landing = spare[j % (depth + 1), :ahead.recv.numel()] if ahead.add else ahead.recv
            started.append((start_messages(peers, send=(ahead.send, right),
                                           recv=(landing, left)), landing))
        works, landing = started[i]
        wait_all(works)
        if unit.add:
            unit.recv.add_(landing)  # my partial sum of this slice + the one from the left


def _reduce_scatter(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    _run_ring(*_ring_units(flat, peers, slice_bytes, reduce=True), flat, peers)


def _all_gather(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    _run_ring(*_ring_units(flat, peers, slice_bytes, reduce=False), flat, peers)


def _ring_all_reduce(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    """Both halves as one stream of messages: the all-gather starts while the last adds run."""
    scatter, num_slices = _ring_units(flat, peers, slice_bytes, reduce=True)
    gather, _ = _ring_units(flat, peers, slice_bytes, reduce=False)
    _run_ring(scatter + gather, num_slices, flat, peers)


def recursive_doubling_all_reduce(tensor: torch.Tensor, group=None,
                                  counter: ByteCounter | None = None, *, check: bool = True):
    """Swap and add with rank XOR 1, 2, 4, ...; extra ranks fold in first. In place; returns."""
    return _in_place("recursive_doubling_all_reduce", tensor, group, counter,
                     algorithm=_recursive_doubling, check=check)


def _recursive_doubling(flat: torch.Tensor, peers: Peers) -> None:
    n, r = peers.world_size, peers.rank
    power = 1 << (n.bit_length() - 1)  # the largest power of two <= N
    if r >= power:  # an extra rank: hand my tensor to rank r - power, get the sum back later
        wait_all(start_messages(peers, send=(flat, r - power)))
        wait_all(start_messages(peers, recv=(flat, r - power)))
        return
    incoming = receive_buffer(flat.numel(), flat)  # (numel,) the partner's partial sum
    if r + power < n:  # fold: my tensor + the extra rank's
        wait_all(start_messages(peers, recv=(incoming, r + power)))
        flat.add_(incoming)
    distance = 1
    while distance < power:  # after the round with distance d, blocks of 2d ranks agree
        partner = r ^ distance
        wait_all(start_messages(peers, send=(flat, partner), recv=(incoming, partner)))
        if r < partner:
            flat.add_(incoming)  # lower rank's sum + higher rank's: the same order on both
        else:
            torch.add(incoming, flat, out=flat)
        distance *= 2
    if r + power < n:  # unfold: the extra rank gets the final sum
        wait_all(start_messages(peers, send=(flat, r + power)))
