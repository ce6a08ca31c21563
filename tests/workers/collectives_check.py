"""Every hand-written all-reduce against ``dist.all_reduce`` on awkward tensors, launched by
tests/test_collectives.py (one launch per world size, any world size).

Every rank makes its own random tensors (0-d, empty, one element, fewer elements than ranks, a
size not divisible by the world size, ~10k elements, a transposed 2-D view, several dtypes),
runs each algorithm of ``course_lib.core.collectives`` and ``course_lib.core.fast_ring`` on a
copy and ``dist.all_reduce`` on another, and records whether they agree, whether all ranks hold
the same bits and how many bytes each rank sent. It also checks the two halves of the ring
separately and that, with ``check=True``, a rank passing another shape or dtype makes every
rank raise ``ValueError``. Rank 0 hands the summary back with ``save_result``.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from course_lib.core.collectives import (
    ByteCounter,
    naive_all_reduce,
    recursive_doubling_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from course_lib.core.fast_ring import fast_ring_all_reduce
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker


def ring_halves(tensor, group=None, counter=None, check=False):
    """Reduce-scatter then all-gather: must be exactly ``ring_all_reduce``."""
    return ring_all_gather(ring_reduce_scatter(tensor, group, counter, check), group, counter)


ALGORITHMS = {
    "naive": naive_all_reduce,
    "ring": ring_all_reduce,
    "ring_halves": ring_halves,
    "recursive_doubling": recursive_doubling_all_reduce,
    "fast_ring": fast_ring_all_reduce,
    "fast_ring_small_slices": partial(fast_ring_all_reduce, slice_bytes=1000),  # ~10 per chunk
    "fast_ring_tiny_slices": partial(fast_ring_all_reduce, slice_bytes=4),  # one element each
    "fast_ring_no_pipeline": partial(fast_ring_all_reduce, slice_bytes=1000, depth=0),
    "fast_ring_two_streams": partial(fast_ring_all_reduce, slice_bytes=1000, one_stream=False),
    "fast_ring_fresh_buffers": partial(fast_ring_all_reduce, reuse_buffers=False),
}
TINY_SLICES_MAX_NUMEL = 64  # one message per element: only on small tensors, for test speed


def make_cases(rank: int, world_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Awkward tensors, random and different on each rank (seeded by the rank)."""
    g = torch.Generator().manual_seed(1000 + rank)
    small_ints = lambda n, dtype: torch.randint(-8, 9, (n,), generator=g).to(dtype)
    cases = {
        "0-d": torch.randn((), generator=g),
        "empty": torch.randn(0, generator=g),
        "empty 2-D": torch.randn(0, 3, generator=g),
        "one element": torch.randn(1, generator=g),
        "fewer than ranks": torch.randn(max(world_size - 1, 1), generator=g),
        "not divisible": torch.randn(world_size * 5 + 1, generator=g),
        "10k": torch.randn(10_007, generator=g),
        "transposed 2-D": torch.randn(7, 5, generator=g).t(),  # (5, 7), not contiguous
        "int64": torch.randint(-1000, 1000, (37,), generator=g),
        "int32 transposed": torch.randint(-50, 50, (4, 6), generator=g, dtype=torch.int32).t(),
        "float64": torch.randn(3, 11, generator=g, dtype=torch.float64),
        "10-d": torch.randn(2, 1, 1, 1, 1, 1, 1, 1, 3, 2, generator=g),  # past the shown dims
        "float16": small_ints(13, torch.float16),  # small integers: sums are exact
        "bfloat16": small_ints(13, torch.bfloat16),
    }
    return {name: t.to(device) for name, t in cases.items()}


def exact(dtype: torch.dtype) -> bool:
    """Integers, and the half types here (small integer values), must match exactly."""
    return not dtype.is_floating_point or dtype in (torch.float16, torch.bfloat16)


def reference_sum(x: torch.Tensor, group) -> torch.Tensor:
    """PyTorch's all-reduce on a contiguous copy: what ours must equal."""
    ref = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(ref, group=group)
    return ref


# torch.testing.assert_close's default tolerances (rtol, atol); calling it in a worker would
# import torch.distributed.tensor first, seconds of start-up in every launch
TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def close(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """'' when equal within tolerance (exactly for integer data), else what differs."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return (f"got shape {tuple(actual.shape)} {actual.dtype}, expected "
                f"{tuple(expected.shape)} {expected.dtype}")
    if exact(expected.dtype):
        ok = torch.equal(actual, expected)
    else:
        rtol, atol = TOLERANCES[expected.dtype]
        ok = torch.allclose(actual, expected, rtol=rtol, atol=atol)
    if ok:
        return ""
    worst = (actual.double() - expected.double()).abs().max().item()
    return f"differs from dist.all_reduce by up to {worst:.3g}"


def same_bits_everywhere(x: torch.Tensor, group, world_size: int) -> bool:
    """True when every rank holds exactly these bytes."""
    mine = x.reshape(-1).contiguous().view(torch.uint8)  # (numel * element_size,)
    if mine.numel() == 0:
        return True
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=group)
    return all(torch.equal(other, mine) for other in everyone)


def check_all_reduce(w, name: str, fn, case: str, x: torch.Tensor) -> dict:
    ref = reference_sum(x, w.group)
    mine = x.clone()  # keeps the strides: a transposed case stays non-contiguous
    counter = ByteCounter()
    returned = fn(mine, group=w.group, counter=counter)
    return {"algorithm": name, "case": case, "numel": x.numel(),
            "element_size": x.element_size(), "shape": list(x.shape),
            "contiguous_input": mine.is_contiguous(), "same_object": returned is mine,
            "shape_kept": list(mine.shape) == list(x.shape) and mine.dtype == x.dtype,
            "error": close(mine, ref), "bitwise_same": same_bits_everywhere(mine, w.group,
                                                                            w.world_size),
            "bytes_sent": counter.bytes_sent, "messages": counter.messages}


def my_chunk(numel: int, rank: int, world_size: int, device) -> torch.Tensor:
    """Indices of chunk ``rank``, from ``torch.tensor_split`` (an independent reference)."""
    return torch.tensor_split(torch.arange(numel), world_size)[rank].to(device)


def check_reduce_scatter(w, case: str, x: torch.Tensor) -> dict:
    ref = reference_sum(x, w.group).reshape(-1)
    mine, counter = x.clone(), ByteCounter()
    ring_reduce_scatter(mine, group=w.group, counter=counter)
    idx = my_chunk(x.numel(), w.rank, w.world_size, x.device)
    return {"case": case, "numel": x.numel(), "element_size": x.element_size(),
            "error": close(mine.reshape(-1)[idx], ref[idx]), "bytes_sent": counter.bytes_sent}


def check_all_gather(w, case: str, x: torch.Tensor) -> dict:
    """Rank r starts with only chunk r right (rank-specific junk elsewhere); all must end equal."""
    final = torch.arange(x.numel(), device=x.device).reshape(x.shape).to(x.dtype) * 3 + 1
    mine = torch.full_like(x, -7 - w.rank)  # junk outside my chunk, different on each rank
    idx = my_chunk(x.numel(), w.rank, w.world_size, x.device)
    flat = mine.reshape(-1).clone()
    flat[idx] = final.reshape(-1)[idx]
    mine.copy_(flat.view(mine.shape))  # keeps mine's strides
    counter = ByteCounter()
    ring_all_gather(mine, group=w.group, counter=counter)
    return {"case": case, "numel": x.numel(), "element_size": x.element_size(),
            "error": close(mine, final), "bytes_sent": counter.bytes_sent}


def check_mismatch(w, name: str, fn, what: str) -> dict:
    """The last rank passes another shape (same numel) or dtype; with check=True every rank
    must raise."""
    odd = w.rank == w.world_size - 1
    shape = (3, 2) if (what == "shape" and odd) else (2, 3)
    dtype = torch.float64 if (what == "dtype" and odd) else torch.float32
    message = ""
    try:
        fn(torch.ones(shape, dtype=dtype, device=w.device), group=w.group, check=True)
    except ValueError as e:
        message = str(e)
    healthy = torch.ones(3, device=w.device)  # the group must still work afterwards
    fn(healthy, group=w.group)
    return {"algorithm": name, "what": what, "message": message,
            "healthy_after": bool((healthy == w.world_size).all())}


def run_checks(w) -> dict:
    cases = make_cases(w.rank, w.world_size, w.device)
    report = {"all_reduce": [], "reduce_scatter": [], "all_gather": [], "mismatch": []}
    for name, fn in ALGORITHMS.items():
        for case, x in cases.items():
            if name == "fast_ring_tiny_slices" and x.numel() > TINY_SLICES_MAX_NUMEL:
                continue
            report["all_reduce"].append(check_all_reduce(w, name, fn, case, x))
    for case, x in cases.items():
        report["reduce_scatter"].append(check_reduce_scatter(w, case, x))
        report["all_gather"].append(check_all_gather(w, case, x))
    if w.world_size > 1:  # one rank cannot disagree with itself
        for name, fn in ALGORITHMS.items():
            for what in ("shape", "dtype"):
                report["mismatch"].append(check_mismatch(w, name, fn, what))
    return report


def main() -> None:
    with worker(seed=0) as w:
        report = run_checks(w)
        reports = [None] * w.world_size
        dist.all_gather_object(reports, report, group=w.group)  # rank 0 sees every rank's
        failures = sum(bool(r["error"]) for rep in reports for key in ("all_reduce",
                       "reduce_scatter", "all_gather") for r in rep[key])
        print0(w, f"collectives self-test on {w.world_size} ranks: {failures} value errors")
        save_result({"world_size": w.world_size, "backend": w.backend, "ranks": reports})
        dist.barrier(group=w.group)  # nobody closes its connections while a peer still talks


if __name__ == "__main__":
    main()
