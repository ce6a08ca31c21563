"""The point-to-point layer under ``course_lib.core.collectives`` (notebook 06).

- ``Peers``: where this rank sits (group, rank, world size), passed to every step explicitly.
- ``start_messages``: start one send and one receive together; ``wait_all`` waits for them.
- ``ByteCounter``: what a rank sent (bytes and messages), to check the 2(N-1)/N law.
- ``check_same_signature``: the safety check every collective runs before moving data.
- ``receive_buffer``: scratch memory for incoming data, reused from call to call.

Why the check: a rank that passes a tensor of another shape or dtype would make the others
wait for bytes that never come, or add mismatched halves. So every rank first shares a tiny
*signature* ``[dtype code, ndim, shape...]`` with every other rank (a dissemination
all-gather: in round k rank r sends what it knows to r + 2^k and hears from r - 2^k, so
after ceil(log2 N) rounds everyone knows everyone's). All ranks then see the same table and,
if it disagrees, all raise the same ``ValueError``. These few bytes are not counted in a
``ByteCounter``: they are a safety check, not part of the algorithm whose cost it measures.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

# dtype <-> small integer, so that a signature is a plain int64 tensor
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
SHOWN_DIMS = 8  # a signature holds the first 8 sizes exactly and a fingerprint of the rest
RECORD_LEN = 2 + SHOWN_DIMS + 1  # [dtype code, ndim, size 0 .. size 7 (0-padded), fingerprint]
REUSED_BYTES_MAX = 64 << 20  # receive buffers up to this size are kept for the next call
_buffers = threading.local()  # per thread: {dtype: CPU buffer}; threads never share one


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


def resolve_group(group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup, int, int]:
    """The group (the default one for None), this rank's index in it and its size."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("no process group: call these functions inside "
                           "`with course_lib.runtime.worker.worker() as w:` in a launched module")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group it was given; pass a "
                         "group that contains it (or group=None for every process)")
    return group, rank, dist.get_world_size(group)


def check_tensor(tensor: torch.Tensor, name: str) -> None:
    """A clear error for inputs that no collective here can handle."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise ValueError(f"{name} does not support dtype {tensor.dtype}; convert the tensor to "
                         f"one of: {names}")
    if tensor.layout != torch.strided:
        raise ValueError(f"{name} needs a dense tensor; call .to_dense() first")


def start_messages(peers: Peers, send: tuple | None = None, recv: tuple | None = None) -> list:
    """Start a receive ``(tensor, from_rank)`` and a send ``(tensor, to_rank)`` together.

    Empty tensors are skipped (both ends know the sizes). On NCCL the pair goes out as one
    batch: a lone receive posted before a send to the same peer would wait for ever. Gloo's
    ``batch_isend_irecv`` only calls ``irecv``/``isend`` in turn, so we call them directly.
    """
    ops = []
    if recv is not None and recv[0].numel() > 0:  # posted first: the sender may go at once
        ops.append((dist.irecv, recv[0], recv[1]))
    if send is not None and send[0].numel() > 0:
        ops.append((dist.isend, send[0], send[1]))
        if peers.counter is not None:
            peers.counter.add(send[0])
    if peers.batch and ops:
        return dist.batch_isend_irecv([dist.P2POp(op, tensor, group=peers.group, group_peer=peer)
                                       for op, tensor, peer in ops])
    return [dist.isend(t, group=peers.group, group_dst=peer) if op is dist.isend
            else dist.irecv(t, group=peers.group, group_src=peer) for op, t, peer in ops]


def wait_all(works: list) -> None:
    for work in works:
        work.wait()


def receive_buffer(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A ``(numel,)`` scratch tensor of ``like``'s dtype and device, for incoming data.

    On the CPU it is kept and handed out again on the next call from the same thread: memory
    fresh from the system is zeroed page by page on first touch, which cost more than the
    addition itself here (about 2 ms of CPU per 4 MB). GPU memory is reused by PyTorch's
    caching allocator already. Its content is garbage until a message lands in it.
    """
    size = numel * like.element_size()
    if like.device.type != "cpu" or size > REUSED_BYTES_MAX:
        return torch.empty(numel, dtype=like.dtype, device=like.device)
    kept = _buffers.__dict__.setdefault("by_dtype", {})
    if like.dtype not in kept or kept[like.dtype].numel() < numel:
        kept[like.dtype] = torch.empty(numel, dtype=like.dtype)
    return kept[like.dtype][:numel]


def signature(tensor: torch.Tensor) -> list[int]:
    """``RECORD_LEN`` integers that differ when the dtype or the shape differs."""
    shape = list(tensor.shape)
    fingerprint = 0
    for size in shape[SHOWN_DIMS:]:  # sizes past the 8th (rare): a polynomial hash of them
        fingerprint = (fingerprint * 1_000_003 + size + 1) % (2**61 - 1)
    shown = shape[:SHOWN_DIMS] + [0] * (SHOWN_DIMS - min(len(shape), SHOWN_DIMS))
    return [DTYPES.index(tensor.dtype), len(shape), *shown, fingerprint]


def describe(record: list[int]) -> str:
    ndim, sizes = record[1], record[2:2 + min(record[1], SHOWN_DIMS)]
    if ndim <= SHOWN_DIMS:
        shape = str(tuple(sizes))
    else:
        shape = f"({', '.join(map(str, sizes))}, ... {ndim - SHOWN_DIMS} more)"
    return f"shape {shape} and dtype {DTYPES[record[0]]}"


def share_signatures(tensor: torch.Tensor, peers: Peers) -> list[list[int]]:
    """Every rank's signature, on every rank: ceil(log2 N) rounds of one send + one receive."""
    n, r = peers.world_size, peers.rank
    # known[i] = signature of rank r - i; NCCL moves only GPU tensors: it lives with the data
    known = torch.zeros((n, RECORD_LEN), dtype=torch.int64, device=tensor.device)  # (N, len)
    known[0] = torch.tensor(signature(tensor), dtype=torch.int64)
    quiet = Peers(peers.group, r, n, None, peers.batch)  # not counted: not the algorithm
    distance = 1
    while distance < n:
        count = min(distance, n - distance)  # what I know so far, but no more than is missing
        # I know ranks r .. r-distance+1; the rank `distance` behind me knows the ones before
        wait_all(start_messages(quiet, send=(known[:count], (r + distance) % n),
                                recv=(known[distance:distance + count], (r - distance) % n)))
        distance *= 2
    rows = known.tolist()
    return [rows[(r - rank) % n] for rank in range(n)]


def check_same_signature(tensor: torch.Tensor, peers: Peers, name: str) -> None:
    """Raise the same ``ValueError`` on every rank unless all ranks pass alike tensors."""
    table = share_signatures(tensor, peers)
    odd = [rank for rank, record in enumerate(table) if record != table[0]]
    if not odd:
        return
    shown = "; ".join(f"rank {rank} has {describe(table[rank])}" for rank in odd[:3])
    more = f" (and {len(odd) - 3} more ranks)" if len(odd) > 3 else ""
    raise ValueError(f"{name}: the ranks passed different tensors: rank 0 has "
                     f"{describe(table[0])}; {shown}{more}. Every rank must pass a tensor of "
                     "the same shape and dtype.")
