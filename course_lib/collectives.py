"""All-reduce built by hand from point-to-point messages (notebook 06, all-reduce from scratch).

Every function here takes one tensor per rank and, in place, leaves the SUM over all ranks in
it on every rank (bitwise the same everywhere), then returns it. They use only
``isend``/``irecv`` (through ``batch_isend_irecv``), never ``dist.all_reduce``:

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
names both (``course_lib.collectives_checks``) instead of a hang.

Pass ``counter=ByteCounter()`` to count what this rank sends; the shape check's few bytes are
not counted. The ring's sends are pipelined: each chunk travels as slices, so the next slice
is on the wire while the previous one is added (``slice_bytes`` sets their size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.collectives_checks import check_same_signature, check_tensor, resolve_group

SLICE_BYTES = 1 << 20  # the ring sends each chunk as slices of about this many bytes
PIPELINE_DEPTH = 2  # ring slices in flight while one is added


@dataclass
class ByteCounter:
    """What one rank sent: add one to ``messages`` and the size to ``bytes_sent`` per send."""

    bytes_sent: int = 0  # payload bytes this rank handed to send
    messages: int = 0  # number of sends (empty ones are skipped, not counted)

    def add(self, tensor: torch.Tensor) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        self.messages += 1


@dataclass(frozen=True)
class Peers:
    """Where this rank sits, passed to every step explicitly."""

    group: dist.ProcessGroup  # the process group the messages go through
    rank: int  # this rank's index in the group
    world_size: int  # number of ranks in the group
    counter: ByteCounter | None  # adds up what this rank sends, or None
    batch: bool  # start a send and a receive as one batch (NCCL needs it; Gloo does not)


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


def start_messages(peers: Peers, send: tuple | None = None, recv: tuple | None = None) -> list:
    """Start a send ``(tensor, to_rank)`` and a receive ``(tensor, from_rank)`` together.

    Empty tensors are skipped (both ends know the sizes). On NCCL the pair goes out as one
    batch: a lone receive posted before a send to the same peer would wait for ever. Gloo's
    ``batch_isend_irecv`` only calls ``isend``/``irecv`` in turn, so we call them directly.
    """
    ops = []
    if send is not None and send[0].numel() > 0:
        ops.append((dist.isend, send[0], send[1]))
        if peers.counter is not None:
            peers.counter.add(send[0])
    if recv is not None and recv[0].numel() > 0:
        ops.append((dist.irecv, recv[0], recv[1]))
    if peers.batch and ops:
        return dist.batch_isend_irecv([dist.P2POp(op, tensor, group=peers.group, group_peer=peer)
                                       for op, tensor, peer in ops])
    return [dist.isend(t, group=peers.group, group_dst=peer) if op is dist.isend
            else dist.irecv(t, group=peers.group, group_src=peer) for op, t, peer in ops]


def wait_all(works: list) -> None:
    for work in works:
        work.wait()


def _in_place(name: str, tensor: torch.Tensor, group=None, counter=None, *, algorithm,
              batch: bool | None = None, **options):
    """Check the inputs, run ``algorithm(flat, peers)`` on a contiguous 1-D view, copy back.

    ``batch``: send pairs with ``batch_isend_irecv`` (None: only where the backend needs it).
    """
    check_tensor(tensor, name)
    group, rank, world_size = resolve_group(group)
    if world_size == 1:
        return tensor  # the sum over one rank is the tensor itself
    check_same_signature(tensor, group, rank, world_size, name)
    if batch is None:
        batch = dist.get_backend(group) != "gloo"
    peers = Peers(group, rank, world_size, counter, batch)
    with torch.no_grad():
        contiguous = tensor.is_contiguous()
        flat = tensor.view(-1) if contiguous else tensor.contiguous().view(-1)  # (numel,)
        if flat.numel() > 0:
            algorithm(flat, peers, **options)
        if not contiguous:
            tensor.copy_(flat.view(tensor.shape))
    return tensor


def naive_all_reduce(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None):
    """Gather every tensor on rank 0, add them there, send the sum back. In place; returns it."""
    return _in_place("naive_all_reduce", tensor, group, counter, algorithm=_naive)


def _naive(flat: torch.Tensor, peers: Peers) -> None:
    if peers.rank != 0:
        wait_all(start_messages(peers, send=(flat, 0)))
        wait_all(start_messages(peers, recv=(flat, 0)))  # the sum, computed on rank 0
        return
    incoming = torch.empty_like(flat)  # (numel,) one other rank's tensor at a time
    for src in range(1, peers.world_size):
        wait_all(start_messages(peers, recv=(incoming, src)))
        flat.add_(incoming)  # always in rank order: 0 + 1 + 2 + ...
    works = []
    for dst in range(1, peers.world_size):
        works += start_messages(peers, send=(flat, dst))
    wait_all(works)


def ring_all_reduce(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                    *, slice_bytes: int = SLICE_BYTES):
    """Reduce-scatter then all-gather round a ring. In place; returns ``tensor``."""
    return _in_place("ring_all_reduce", tensor, group, counter, algorithm=_ring_all_reduce,
                     slice_bytes=slice_bytes)


def ring_reduce_scatter(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                        *, slice_bytes: int = SLICE_BYTES):
    """Afterwards chunk r (``chunk_bounds``) of ``tensor.view(-1)`` on rank r holds the full sum.

    The other chunks hold partial sums. In place; returns ``tensor``.
    """
    return _in_place("ring_reduce_scatter", tensor, group, counter, algorithm=_reduce_scatter,
                     slice_bytes=slice_bytes)


def ring_all_gather(tensor: torch.Tensor, group=None, counter: ByteCounter | None = None,
                    *, slice_bytes: int = SLICE_BYTES):
    """Rank r's chunk r is final; fill every other chunk from its owner. In place; returns it."""
    return _in_place("ring_all_gather", tensor, group, counter, algorithm=_all_gather,
                     slice_bytes=slice_bytes)


def _ring_all_reduce(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    _reduce_scatter(flat, peers, slice_bytes)
    _all_gather(flat, peers, slice_bytes)


def _ring_plan(flat: torch.Tensor, peers: Peers, slice_bytes: int, first_send_offset: int):
    """The ring's units of work in order: ``(send slice, receive slice)`` per step and slice.

    At step s rank r sends chunk (r - s - offset) % N right and receives chunk
    (r - s - offset - 1) % N from the left. Every chunk is cut into the same number of
    slices, so both ends of each message agree on its size.
    """
    n, r = peers.world_size, peers.rank
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]  # N x (numel/N,)
    biggest = chunks[0].numel() * flat.element_size()
    num_slices = max(1, -(-biggest // max(1, slice_bytes)))  # ceil: slices per chunk
    sliced = [[c[a:b] for a, b in chunk_bounds(c.numel(), num_slices)] for c in chunks]
    units = []
    for step in range(n - 1):
        send_chunk = (r - step - first_send_offset) % n
        recv_chunk = (send_chunk - 1) % n
        units += list(zip(sliced[send_chunk], sliced[recv_chunk], strict=True))
    return units, num_slices


def _reduce_scatter(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    """N-1 steps; in step s rank r sends chunk r-s-1 and adds the incoming chunk r-s-2 into it.

    After the last step rank r has added the last contribution into chunk r: the full sum.
    Slices are pipelined: while slice i is added, the next ones are on the wire.
    """
    right, left = (peers.rank + 1) % peers.world_size, (peers.rank - 1) % peers.world_size
    units, num_slices = _ring_plan(flat, peers, slice_bytes, first_send_offset=1)
    # a unit sends a slice summed num_slices units earlier: never run further ahead than that
    depth = min(PIPELINE_DEPTH, num_slices - 1)
    longest = max(dst.numel() for _, dst in units)
    spare = torch.empty((depth + 1, longest), dtype=flat.dtype, device=flat.device)
    started = []  # (works, receive buffer) per unit, in order
    for i, (_, dst) in enumerate(units):
        while len(started) < min(i + depth + 1, len(units)):  # keep `depth` units ahead
            send, recv = units[len(started)]
            buffer = spare[len(started) % (depth + 1), :recv.numel()]  # (slice,) free again
            started.append((start_messages(peers, send=(send, right), recv=(buffer, left)),
                            buffer))
        works, incoming = started[i]
        wait_all(works)
        dst.add_(incoming)  # my partial sum of this slice + the one from the left


def _all_gather(flat: torch.Tensor, peers: Peers, slice_bytes: int) -> None:
    """N-1 steps; in step s rank r sends chunk r-s (its own first) and receives chunk r-s-1.

    Each receive lands straight in its place in ``flat``; a slice is passed on one step later.
    """
    right, left = (peers.rank + 1) % peers.world_size, (peers.rank - 1) % peers.world_size
    units, num_slices = _ring_plan(flat, peers, slice_bytes, first_send_offset=0)
    depth = min(PIPELINE_DEPTH, num_slices - 1)  # a unit forwards what arrived num_slices ago
    started = []
    for i in range(len(units)):
        while len(started) < min(i + depth + 1, len(units)):
            send, recv = units[len(started)]
            started.append(start_messages(peers, send=(send, right), recv=(recv, left)))
        wait_all(started[i])


def recursive_doubling_all_reduce(tensor: torch.Tensor, group=None,
                                  counter: ByteCounter | None = None):
    """Swap and add with rank XOR 1, 2, 4, ...; extra ranks fold in first. In place; returns."""
    return _in_place("recursive_doubling_all_reduce", tensor, group, counter,
                     algorithm=_recursive_doubling)


def _recursive_doubling(flat: torch.Tensor, peers: Peers) -> None:
    n, r = peers.world_size, peers.rank
    power = 1 << (n.bit_length() - 1)  # the largest power of two <= N
    if r >= power:  # an extra rank: hand my tensor to rank r - power, get the sum back later
        wait_all(start_messages(peers, send=(flat, r - power)))
        wait_all(start_messages(peers, recv=(flat, r - power)))
        return
    incoming = torch.empty_like(flat)  # (numel,) the partner's partial sum
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
