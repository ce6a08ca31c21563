"""Hand-written collectives (course_lib.core.collectives) against dist.all_reduce, on Gloo.

One launch of ``tests/workers/collectives_check.py`` per world size (1, 2, 3, 4) runs every
algorithm on awkward tensors; the tests here assert on the summary it hands back. Expected
byte counts are computed here from the chunk sizes of ``torch.tensor_split``, independently of
``course_lib.core.collectives.chunk_bounds``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import course_lib.core
from course_lib.core import collectives, messages
from course_lib.core.collectives import ByteCounter, chunk_bounds, ring_all_reduce
from course_lib.core.fast_ring import REUSED_BYTES_MAX, fast_ring_all_reduce, receive_buffer
from course_lib.runtime.launch import launch

WORKER = str(Path(__file__).parent / "workers" / "collectives_check.py")
WORLD_SIZES = [1, 2, 3, 4]
RING_LIKE = ("ring", "ring_halves", "fast_ring", "fast_ring_small_slices",
             "fast_ring_tiny_slices", "fast_ring_no_pipeline", "fast_ring_two_streams",
             "fast_ring_fresh_buffers")
DOUBLING = ("recursive_doubling",)
ALL_ALGORITHMS = (*RING_LIKE, *DOUBLING, "naive")


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"world{n}")
def report(request) -> dict:
    """The self-test's summary at one world size (one launch, shared by the tests below)."""
    run = launch(WORKER, nproc=request.param, timeout_s=150,
                 quiet=True, env={"COURSE_BACKEND": "gloo"})
    assert run.returncode == 0
    assert run.result is not None, run.output
    assert run.result["world_size"] == request.param
    assert len(run.result["ranks"]) == request.param
    return run.result


def chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Sizes of the chunks, from torch.tensor_split (the reference convention)."""
    return [len(c) for c in torch.tensor_split(torch.arange(numel), world_size)]


def entries(report: dict, key: str, **match) -> list[tuple[int, dict]]:
    """(rank, entry) for every rank's entries under ``key`` that match the given fields."""
    found = [(rank, e) for rank, rep in enumerate(report["ranks"]) for e in rep[key]
             if all(e[k] == v for k, v in match.items())]
    assert found, f"no {key} entries match {match}"
    return found


# --- pure functions, no processes ------------------------------------------------------------

@pytest.mark.parametrize("numel", [0, 1, 2, 3, 5, 7, 16, 10_007])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_chunk_bounds_match_tensor_split(numel, world_size):
    bounds = chunk_bounds(numel, world_size)
    assert len(bounds) == world_size
    assert [end - start for start, end in bounds] == chunk_sizes(numel, world_size)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(world_size - 1))  # contiguous
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_chunk_bounds_rejects_nonsense():
    with pytest.raises(ValueError, match="world_size"):
        chunk_bounds(10, 0)
    with pytest.raises(ValueError, match="numel"):
        chunk_bounds(-1, 2)


def test_byte_counter_adds_sizes():
    counter = ByteCounter()
    counter.add(torch.zeros(3, dtype=torch.float64))
    counter.add(torch.zeros(2, 5, dtype=torch.int16))
    assert (counter.bytes_sent, counter.messages) == (3 * 8 + 10 * 2, 2)


def test_receive_buffers_are_reused_per_thread_and_dtype():
    like = torch.zeros(1)
    first = receive_buffer(1000, like)
    again = receive_buffer(10, like)
    assert first.shape == (1000,) and again.shape == (10,)
    assert again.data_ptr() == first.data_ptr()  # the same memory, handed out again
    assert receive_buffer(10, torch.zeros(1, dtype=torch.int64)).dtype == torch.int64
    bigger = receive_buffer(5000, like)  # grows when asked for more
    assert bigger.shape == (5000,) and receive_buffer(5000, like).data_ptr() == bigger.data_ptr()
    other = []
    thread = threading.Thread(target=lambda: other.append(receive_buffer(10, like).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != bigger.data_ptr()  # another thread never shares it
    huge = receive_buffer(REUSED_BYTES_MAX // 4 + 1, like)  # too big to keep
    assert huge.data_ptr() != bigger.data_ptr()
    assert receive_buffer(10, like).data_ptr() == bigger.data_ptr()  # the kept one is unchanged


def test_without_process_group_the_error_says_how_to_start():
    with pytest.raises(RuntimeError, match="course_lib.runtime.worker"):
        ring_all_reduce(torch.ones(3))


CHECKABLE = [collectives.naive_all_reduce, collectives.ring_reduce_scatter,
             collectives.ring_all_gather, collectives.ring_all_reduce,
             collectives.recursive_doubling_all_reduce, fast_ring_all_reduce]


@pytest.mark.parametrize("algorithm", CHECKABLE, ids=lambda f: f.__name__)
def test_the_shape_check_is_one_all_gather_and_only_when_asked(one_process_group, monkeypatch,
                                                               algorithm):
    gathers, real = [], dist.all_gather

    def all_gather(*args, **kwargs):
        gathers.append(args[1].shape)  # what each rank shares
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "all_gather", all_gather)
    algorithm(torch.ones(5), group=one_process_group)
    assert gathers == []  # no collective besides the algorithm's own messages
    algorithm(torch.ones(5), group=one_process_group, check=True)
    assert gathers == [(1,)]  # one number per rank
    doc = inspect.getdoc(collectives)
    assert "check=True" in doc and "one more collective (a small all_gather) per call" in doc


NOTEBOOK_06 = [messages.send_recv, collectives.naive_all_reduce, collectives.send_chunk,
               collectives.ring_reduce_scatter, collectives.ring_all_gather,
               collectives.ring_all_reduce, collectives.recursive_doubling_all_reduce]
GROUP = "dist.ProcessGroup | None"  # as source text, under `from __future__ import annotations`
GROUP_TYPES = (GROUP, dist.ProcessGroup | None)  # or evaluated, without it


def signature(function) -> inspect.Signature:
    return inspect.signature(inspect.unwrap(function))  # the annotations, as source text


@pytest.mark.parametrize("function", NOTEBOOK_06, ids=lambda f: f.__name__)
def test_the_functions_notebook_06_shows_are_typed(function):
    sig = signature(function)
    assert sig.return_annotation is not inspect.Signature.empty, function.__name__
    for name, parameter in sig.parameters.items():
        assert parameter.annotation is not inspect.Parameter.empty, (function.__name__, name)
        if name in ("tensor", "send", "recv"):
            assert parameter.annotation == "torch.Tensor", (function.__name__, name)
        if name == "group":
            assert parameter.annotation == GROUP, function.__name__


def core_functions():
    """Every function and method defined in course_lib/core, with where it is."""
    for info in pkgutil.iter_modules(course_lib.core.__path__):
        module = importlib.import_module(f"course_lib.core.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                yield from ((f"{name}.{m}", f) for m, f in vars(obj).items()
                            if inspect.isfunction(f))
            elif callable(obj) and getattr(obj, "__module__", None) == module.__name__:
                yield name, obj


def test_every_group_in_core_is_typed():
    typed = 0
    for name, function in core_functions():
        for keyword in ("group", "process_group"):
            parameter = signature(function).parameters.get(keyword)
            if parameter is not None:
                assert parameter.annotation in GROUP_TYPES, name
                typed += 1
    assert typed >= 20


# --- one launch per world size ----------------------------------------------------------------

def test_every_algorithm_equals_dist_all_reduce(report):
    for rank, e in entries(report, "all_reduce"):
        where = f"{e['algorithm']} on {e['case']} at rank {rank}"
        assert e["error"] == "", f"{where}: {e['error']}"
        assert e["same_object"], f"{where}: must return the tensor it was given"
        assert e["shape_kept"], f"{where}: shape or dtype changed"


def test_every_case_ran_for_every_algorithm(report):
    n = report["world_size"]
    cases = {e["case"] for _, e in entries(report, "all_reduce", algorithm="ring")}
    assert len(cases) >= 12
    for name in ALL_ALGORITHMS:
        ran = {e["case"] for _, e in entries(report, "all_reduce", algorithm=name)}
        if name == "fast_ring_tiny_slices":  # one message per element: small cases only
            assert len(ran) >= 10 and ran <= cases
        else:
            assert ran == cases, name
        assert len(entries(report, "all_reduce", algorithm=name)) == len(ran) * n
    transposed = entries(report, "all_reduce", case="transposed 2-D")
    assert all(not e["contiguous_input"] for _, e in transposed)  # really non-contiguous


def test_results_bitwise_identical_on_all_ranks(report):
    for _, e in entries(report, "all_reduce"):
        assert e["bitwise_same"], f"{e['algorithm']} on {e['case']}: ranks differ"


def test_ring_sends_2_n_minus_1_over_n_of_the_bytes(report):
    n = report["world_size"]
    for rank, e in entries(report, "all_reduce"):
        if e["algorithm"] not in RING_LIKE:
            continue
        sizes = chunk_sizes(e["numel"], n)
        # reduce-scatter sends every chunk but my own, all-gather every chunk but my right
        # neighbour's: 2 * numel - size[r] - size[r + 1] elements
        expected = (2 * e["numel"] - sizes[rank] - sizes[(rank + 1) % n]) * e["element_size"]
        if n == 1:
            expected = 0
        assert e["bytes_sent"] == expected, f"{e['algorithm']} {e['case']} rank {rank}"
        law = 2 * (n - 1) / n * e["numel"] * e["element_size"]  # the 2(N-1)/N law
        assert abs(e["bytes_sent"] - law) <= 2 * e["element_size"]  # chunk rounding only
        if e["numel"] % n == 0:
            assert e["bytes_sent"] == law


def test_naive_and_recursive_doubling_byte_counts(report):
    n = report["world_size"]
    power = 2 ** int(math.log2(n))
    for rank, e in entries(report, "all_reduce", algorithm="naive"):
        nbytes = e["numel"] * e["element_size"]
        expected = 0 if n == 1 else ((n - 1) * nbytes if rank == 0 else nbytes)
        assert e["bytes_sent"] == expected, f"naive {e['case']} rank {rank}"
    doubling = [(rank, e) for rank, e in entries(report, "all_reduce") if e["algorithm"]
                in DOUBLING]
    for rank, e in doubling:
        nbytes = e["numel"] * e["element_size"]
        rounds = int(math.log2(power)) if rank < power else 0
        folds = 1 if (rank >= power or rank + power < n) else 0  # fold in, or send the result
        assert e["bytes_sent"] == (rounds + folds) * nbytes, f"rd {e['case']} rank {rank}"


def test_ring_messages_per_slice(report):
    """Small slices mean more messages, never more bytes."""
    n = report["world_size"]
    if n == 1:
        return
    by_key = {(rank, e["algorithm"], e["case"]): e for rank, e in entries(report, "all_reduce")}
    for rank in range(n):
        plain = by_key[(rank, "ring", "10k")]
        sliced = by_key[(rank, "fast_ring_small_slices", "10k")]
        assert plain["bytes_sent"] == sliced["bytes_sent"]
        assert plain["messages"] == 2 * (n - 1)  # one message per step
        assert sliced["messages"] > 4 * plain["messages"]


def test_reduce_scatter_leaves_the_full_sum_in_my_chunk(report):
    n = report["world_size"]
    for rank, e in entries(report, "reduce_scatter"):
        assert e["error"] == "", f"{e['case']} rank {rank}: {e['error']}"
        sizes = chunk_sizes(e["numel"], n)
        expected = 0 if n == 1 else (e["numel"] - sizes[rank]) * e["element_size"]
        assert e["bytes_sent"] == expected


def test_all_gather_fills_every_chunk_from_its_owner(report):
    n = report["world_size"]
    for rank, e in entries(report, "all_gather"):
        assert e["error"] == "", f"{e['case']} rank {rank}: {e['error']}"
        sizes = chunk_sizes(e["numel"], n)
        expected = 0 if n == 1 else (e["numel"] - sizes[(rank + 1) % n]) * e["element_size"]
        assert e["bytes_sent"] == expected


def test_mismatched_shape_or_dtype_raises_on_every_rank(report):
    n = report["world_size"]
    if n == 1:
        assert all(not rep["mismatch"] for rep in report["ranks"])
        return
    for what, mine, theirs in (("shape", "(2, 3)", "(3, 2)"),
                               ("dtype", "torch.float32", "torch.float64")):
        found = entries(report, "mismatch", what=what)
        assert len(found) == n * len(ALL_ALGORITHMS)
        for rank, e in found:
            where = f"{e['algorithm']} ({what}) at rank {rank}"
            assert e["message"], f"{where}: no ValueError raised"
            assert "rank 0" in e["message"] and f"rank {n - 1}" in e["message"], where
            assert mine in e["message"] and theirs in e["message"], where
            assert e["healthy_after"], f"{where}: the group did not work afterwards"
