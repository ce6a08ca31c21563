"""Making the ring fast: the textbook ring of ``collectives.py`` plus three changes, made by
four options; notebook 06b (section 6) times each change on its own.

    from course_lib.core.fast_ring import fast_ring_all_reduce
    fast_ring_all_reduce(tensor, group)            # the same sum as ring_all_reduce

The result and the bytes sent are the textbook ring's (``tests/test_collectives.py`` checks
both on every rank); only the order of the work changes:

1. A reused buffer, ``reuse_buffers``: the receive buffer is kept from call to call (per thread
   and dtype), so a call does not ask the system for fresh memory, which it zeroes page by page
   on first touch.
2. Pipelined slices, ``slice_bytes`` and ``depth``: each chunk travels as slices of at most
   ``slice_bytes``, and up to ``depth`` slices are on the wire while the one that arrived is
   added (a pipeline, as NCCL's rings run chunked pipelines). ``depth=0``: one message at a
   time. A chunk that fits in one slice leaves the pipeline nothing to overlap.
3. One stream, ``one_stream``: the all-gather's first messages start while the
   reduce-scatter's last additions run, instead of after them.

``check=True`` is the textbook ring's shape check, off by default there too (so not a change):
one small all_gather more per call, to raise a clear error when the ranks pass different
tensors.

What the timing showed: in the run saved with notebook 06b (2 processes on the course's shared
2-core CPU, 4 and 16 MB, 9 calls each), the three variants ran at 0.95 to 1.17 times the
textbook ring's speed, and every variant's quartiles overlapped the textbook ring's: that run
cannot tell the changes from the noise. Each change removes work the textbook ring does on
every call; whether it shows in the time depends on the machine, and the notebook measures the
noise too (two of its lines run the same code). Each message has a fixed cost (a Python call, a
Gloo handshake, a thread waking up), so slices must stay large on a CPU; on GPUs NCCL pipelines
slices of a few hundred kB.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course_lib.core.collectives import ALL_GATHER, REDUCE_SCATTER, chunk_bounds, send_chunk
from course_lib.core.messages import ByteCounter, done, start_collective

SLICE_BYTES = 4 << 20  # 4 MB: above that, a message's fixed cost no longer matters here
PIPELINE_DEPTH = 2  # slices on the wire while one is added
REUSED_BYTES_MAX = 64 << 20  # receive buffers up to this size are kept for the next call
_kept = threading.local()  # per thread: {dtype: buffer}; threads never share one


@dataclass(frozen=True)
class Message:
    """One step of one slice: send ``send`` right while ``recv``'s data comes from the left."""

    send: torch.Tensor  # (slice,) a view of the flat tensor
    recv: torch.Tensor  # (slice,) the view the incoming slice is for
    add: bool  # reduce-scatter: add the incoming slice to recv; all-gather: it lands in recv


def receive_buffer(numel: int, like: torch.Tensor, reuse: bool = True) -> torch.Tensor:
    """``(numel,)`` scratch memory of ``like``'s dtype and device; kept for the next call (CPU)."""
    size = numel * like.element_size()
    if not reuse or like.device.type != "cpu" or size > REUSED_BYTES_MAX:
        return torch.empty(numel, dtype=like.dtype, device=like.device)  # GPU: torch caches
    kept = _kept.__dict__.setdefault("by_dtype", {})
    if like.dtype not in kept or kept[like.dtype].numel() < numel:
        kept[like.dtype] = torch.empty(numel, dtype=like.dtype)
    return kept[like.dtype][:numel]


def ring_messages(flat: torch.Tensor, rank: int, world_size: int, slice_bytes: int,
                  phase: str) -> tuple[list[Message], int]:
    """The messages of one half of the ring, in order: the textbook steps, each chunk cut into
    the same number of slices (so that both ends agree on every slice's size)."""
    chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), world_size)]  # N x (~numel/N,)
    per_chunk = max(1, -(-chunks[0].numel() * flat.element_size() // max(1, slice_bytes)))
    sliced = [[c[a:b] for a, b in chunk_bounds(c.numel(), per_chunk)] for c in chunks]
    left = (rank - 1) % world_size
    messages = []
    for step in range(world_size - 1):
        mine = send_chunk(rank, step, world_size, phase)
        theirs = send_chunk(left, step, world_size, phase)  # what my left neighbour sends me
        messages += [Message(s, r, phase == REDUCE_SCATTER)
                     for s, r in zip(sliced[mine], sliced[theirs], strict=True)]
    return messages, per_chunk


def start(message: Message, landing: torch.Tensor, right: int, left: int,
          group: dist.ProcessGroup | None, counter: ByteCounter | None) -> list[dist.Work]:
    """Post the receive and the send of one message; return their handles."""
    ops = []
    if landing.numel() > 0:
        ops.append(dist.P2POp(dist.irecv, landing, group=group, group_peer=left))
    if message.send.numel() > 0:
        ops.append(dist.P2POp(dist.isend, message.send, group=group, group_peer=right))
        if counter is not None:
            counter.add(message.send)
    return dist.batch_isend_irecv(ops) if ops else []


def run_pipelined(messages: list[Message], per_chunk: int, flat: torch.Tensor, rank: int,
                  world_size: int, group: dist.ProcessGroup | None, counter: ByteCounter | None,
                  depth: int, reuse_buffers: bool) -> None:
    """Send every message in order, keeping ``depth`` more on the wire while one is added.

    A message sends a slice received ``per_chunk`` messages earlier, so the pipeline never runs
    further ahead than that; slices to add land in ``depth + 1`` spare buffers taken in turn.
    """
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    depth = max(0, min(depth, per_chunk - 1))
    longest = max((m.recv.numel() for m in messages if m.add), default=0)
    spare = receive_buffer((depth + 1) * longest, flat, reuse_buffers).view(depth + 1, longest)
    started = []  # (handles, where the incoming slice lands), one per message, in order
    for i, message in enumerate(messages):
        while len(started) < min(i + depth + 1, len(messages)):  # keep `depth` ahead
            j, ahead = len(started), messages[len(started)]
            landing = spare[j % (depth + 1), :ahead.recv.numel()] if ahead.add else ahead.recv
            started.append((start(ahead, landing, right, left, group, counter), landing))
        handles, landing = started[i]
        for handle in handles:
            handle.wait()
        if message.add:
            message.recv.add_(landing)  # my partial sum of this slice + the one from the left


@torch.no_grad()
def fast_ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                         counter: ByteCounter | None = None, *, reuse_buffers: bool = True,
                         slice_bytes: int = SLICE_BYTES, depth: int = PIPELINE_DEPTH,
                         one_stream: bool = True, check: bool = False) -> torch.Tensor:
    """The ring all-reduce of ``collectives.ring_all_reduce``, pipelined. In place; returns it."""
    rank, world_size, flat = start_collective(tensor, group, check)  # flat: (numel,)
    if world_size == 1 or flat.numel() == 0:
        return done(tensor, flat)
    scatter, per_chunk = ring_messages(flat, rank, world_size, slice_bytes, REDUCE_SCATTER)
    gather, _ = ring_messages(flat, rank, world_size, slice_bytes, ALL_GATHER)
    halves = [scatter + gather] if one_stream else [scatter, gather]
    for messages in halves:
        run_pipelined(messages, per_chunk, flat, rank, world_size, group, counter, depth,
                      reuse_buffers)
    return done(tensor, flat)
