"""Watch the real ring all-reduce step by step, count bytes, compare with dist.all_reduce
(notebook 06).

    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.ring_trace
    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.ring_trace \\
        --pingpong-sizes 8 4096

Runs on any world size >= 2, on Gloo (CPU) or NCCL (one GPU per process).

1. trace: rank r fills an int64 tensor with 2^r and runs ``ring_all_reduce`` with a counter
   that, each time the ring hands a chunk to send, records which chunk it is and a copy of
   the whole tensor. Each element then holds the sum of 2^r over the ranks summed into it so
   far: the bits say who contributed. The states are compared with ``ring_viz.ring_states``.
2. bytes: each algorithm's ``ByteCounter`` for tensors whose size N divides and does not.
3. equal: naive, ring and recursive doubling against ``dist.all_reduce`` on several shapes
   and dtypes; every rank checks its own result.
4. pingpong (with ``--pingpong-sizes``): rank 0 and rank 1 time one message per size, as
   ``course_lib.demos.latency_bandwidth`` does, for the cost model (the other ranks wait).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from course_lib.core.collectives import (
    ByteCounter,
    chunk_bounds,
    naive_all_reduce,
    recursive_doubling_all_reduce,
    ring_all_reduce,
)
from course_lib.demos import latency_bandwidth
from course_lib.lessons import ring_viz
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import Worker, print0, worker

ALGORITHMS = {"naive": naive_all_reduce, "ring": ring_all_reduce,
              "recursive_doubling": recursive_doubling_all_reduce}


class TracingCounter(ByteCounter):
    """A ByteCounter that also notes which chunk is sent and what the tensor holds then."""

    def __init__(self, watched: torch.Tensor):
        super().__init__()
        self.watched = watched  # the tensor being all-reduced (contiguous, 1-D)
        self.sent_chunks: list[int] = []
        self.states: list[list[int]] = []  # the whole tensor before each send

    def add(self, tensor: torch.Tensor) -> None:
        super().add(tensor)
        offset = (tensor.data_ptr() - self.watched.data_ptr()) // tensor.element_size()
        bounds = chunk_bounds(self.watched.numel(), dist.get_world_size())
        self.sent_chunks.append(next(c for c, (a, b) in enumerate(bounds) if a <= offset < b))
        self.states.append(self.watched.cpu().tolist())


def per_chunk(values: list[int], world_size: int) -> list[int] | None:
    """One value per chunk, or None if a chunk's elements disagree (they never should)."""
    chunks = [values[a:b] for a, b in chunk_bounds(len(values), world_size)]
    return [c[0] if len(set(c)) == 1 else None for c in chunks]


def trace_ring(w: Worker, numel: int) -> dict:
    """Run the real ring once and compare each step with ring_viz's prediction."""
    tensor = torch.full((numel,), 1 << w.rank, dtype=torch.int64, device=w.device)
    counter = TracingCounter(tensor)
    ring_all_reduce(tensor, group=w.group, counter=counter)
    seen = [per_chunk(s, w.world_size) for s in counter.states + [tensor.cpu().tolist()]]
    predicted = [ring_viz.as_masks(state)[w.rank] for state in ring_viz.ring_states(w.world_size)]
    sends = [step.sends[w.rank] for step in ring_viz.ring_schedule(w.world_size)]
    mine = {"states": seen, "sent_chunks": counter.sent_chunks,
            "states_match": seen == predicted, "sends_match": counter.sent_chunks == sends}
    everyone = [None] * w.world_size
    dist.all_gather_object(everyone, mine, group=w.group)
    return {"numel": numel, "ranks": everyone}


def count_bytes(w: Worker, numels: list[int]) -> list[dict]:
    """Bytes each rank sends, per algorithm and size (float32), gathered from every rank."""
    rows = []
    for numel in numels:
        for name, algorithm in ALGORITHMS.items():
            counter = ByteCounter()
            algorithm(torch.ones(numel, device=w.device), group=w.group, counter=counter)
            sent = [None] * w.world_size
            dist.all_gather_object(sent, (counter.bytes_sent, counter.messages), group=w.group)
            rows.append({"algorithm": name, "numel": numel, "tensor_bytes": numel * 4,
                         "bytes_sent": [s[0] for s in sent], "messages": [s[1] for s in sent]})
    return rows


def test_tensors(w: Worker) -> dict[str, torch.Tensor]:
    """The same shapes on every rank, different numbers (seeded by rank)."""
    g = torch.Generator().manual_seed(100 + w.rank)
    return {"float32 (1000,)": torch.randn(1000, generator=g),
            "float32 (7, 3)": torch.randn(7, 3, generator=g),
            "float32 (3,) fewer than ranks": torch.randn(3, generator=g),
            "float64 (5, 4) transposed": torch.randn(4, 5, generator=g, dtype=torch.float64).t(),
            "int64 (11,)": torch.randint(-50, 50, (11,), generator=g)}


def compare_with_torch(w: Worker) -> dict[str, dict[str, bool]]:
    """Every rank checks every algorithm against dist.all_reduce; True only if all agree."""
    table = {}
    for label, source in test_tensors(w).items():
        source = source.to(w.device)
        expected = source.clone()
        dist.all_reduce(expected, group=w.group)
        for name, algorithm in ALGORITHMS.items():
            ours = algorithm(source.clone(), group=w.group)
            same = torch.allclose(ours, expected, rtol=1e-5, atol=1e-5)
            flag = torch.tensor(int(same), device=w.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=w.group)  # True on every rank?
            table.setdefault(label, {})[name] = bool(flag.item())
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=None,
                        help="elements of the traced tensor (default 2N + 1: uneven chunks)")
    parser.add_argument("--pingpong-sizes", type=int, nargs="*", default=[],
                        help="also time one message of each of these sizes (bytes)")
    parser.add_argument("--repeats", type=int, default=20, help="ping-pong repeats per size")
    args = parser.parse_args()
    if any(s < 4 or s % 4 for s in args.pingpong_sizes):
        parser.error(f"--pingpong-sizes must be multiples of 4 bytes, got {args.pingpong_sizes}")
    with worker(seed=0) as w:
        if w.world_size < 2:
            raise SystemExit("the trace needs at least 2 processes; use --nproc 2 or more")
        numel = args.numel or 2 * w.world_size + 1
        trace = trace_ring(w, numel)
        byte_rows = count_bytes(w, [w.world_size * 1000, w.world_size * 1000 + 1])
        equal = compare_with_torch(w)
        pingpong = latency_bandwidth.measure(w, args.pingpong_sizes, 3, args.repeats)
        print0(w, f"ring traced on {w.world_size} ranks; every comparison with dist.all_reduce "
                  f"true: {all(all(v.values()) for v in equal.values())}")
        save_result({"world_size": w.world_size, "backend": w.backend, "trace": trace,
                     "bytes": byte_rows, "equal_to_torch": equal, "pingpong": pingpong})


if __name__ == "__main__":
    main()
