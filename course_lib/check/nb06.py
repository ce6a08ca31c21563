"""Checkers for the exercises of notebook 06 (all-reduce from scratch)."""

from __future__ import annotations

import torch

from course_lib.check.answers import expect_type
from course_lib.check.cases import ring_cases, ring_mistakes
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import call_own
from course_lib.core.collectives import REDUCE_SCATTER, chunk_bounds
from course_lib.lessons import network_sim, ring_viz
from course_lib.runtime.workspace import record_pass


def random_chunks(world_size: int, numel: int, seed: int) -> list[list[torch.Tensor]]:
    """chunks[r][c]: rank r's copy of chunk c, chunk sizes as chunk_bounds cuts them."""
    g = torch.Generator().manual_seed(seed)
    flat = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(world_size)]
    return [ring_viz.split_chunks(f, chunk_bounds(numel, world_size)) for f in flat]


def copy_chunks(chunks):
    return [[c.clone() for c in row] for row in chunks]


def same_chunks(a, b) -> bool:
    pairs = [(x, y) for row_a, row_b in zip(a, b, strict=True)
             for x, y in zip(row_a, row_b, strict=True)]
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-12, atol=1e-12)
               for x, y in pairs)


def check_shape(got, world_size: int) -> None:
    what = (f"return the chunks after the step: a list of {world_size} lists (one per rank) "
            f"of {world_size} chunk tensors each")
    expect_type(got, (list, tuple), what)
    expect(len(got) == world_size, f"{what}, not {len(got)} lists")
    for row in got:
        expect_type(row, (list, tuple), what)
        expect(len(row) == world_size, f"{what}; one row has {len(row)}")
        for chunk in row:
            expect_type(chunk, torch.Tensor, what)


def one_step(chunks, step: int, *, send: int = 1, towards: int = 1, adds: bool = True):
    """Reduce-scatter step ``step``: rank r sends chunk (r - step - send) mod N to rank
    (r + towards) mod N, which adds it (or, with ``adds=False``, takes it)."""
    ring_step = ring_viz.phase_steps(len(chunks), REDUCE_SCATTER, send, towards=towards,
                                     adds=adds)[step]
    return ring_viz.apply_step(chunks, ring_step, ring_viz.add)


def name_step_mistake(state, got, step: int) -> None:
    """Raise with a hint naming the mistake ``got`` made, if it is one we know."""
    expect(not same_chunks(got, state), f"nothing changed in step {step}: in every step every "
                                        "rank sends one chunk to its neighbour")
    expect(not same_chunks(got, one_step(state, step, adds=False)),
           "the receiver replaced its copy with the incoming chunk: in a reduce-scatter the "
           "incoming chunk is combined with the receiver's own copy")
    expect(not same_chunks(got, one_step(state, step, towards=-1)),
           "the chunks went to the left-hand neighbour: in this ring every rank sends to the "
           "rank on its right")
    for send in (0, 2):
        expect(not same_chunks(got, one_step(state, step, send=send)),
               f"in step {step} each rank sent a neighbouring chunk of the right one: check "
               "which chunk rank 0 sends in step 0, then how that moves from step to step")
    n = len(state)
    expect(False, f"step {step} with {n} ranks gave other chunks than expected: rank r sends "
                  "one chunk to rank r + 1, which adds it to its own copy of that chunk")


def check_one_step(step_fn, state, step: int):
    """Run the learner's step on a copy; return the right state, or raise with a hint."""
    library = [ring_viz.apply_step, ring_viz.run_steps, ring_viz.simulate_ring_all_reduce]
    got = call_own(step_fn, copy_chunks(state), step, library=library)
    check_shape(got, len(state))
    expected = one_step(state, step)
    if not same_chunks(got, expected):
        name_step_mistake(state, got, step)
    return expected


@exercise("6.1")
def reduce_scatter_step(step_fn) -> None:
    """``step_fn(chunks, step)`` returns the state after reduce-scatter step ``step``."""
    for world_size, numel in ((2, 6), (3, 7), (4, 9), (5, 5)):
        state = random_chunks(world_size, numel, seed=world_size)
        total = [sum(state[r][c] for r in range(world_size)) for c in range(world_size)]
        for step in range(world_size - 1):
            state = check_one_step(step_fn, state, step)
        for r in range(world_size):
            expect(torch.allclose(state[r][r], total[r]),
                   f"after N-1 steps rank {r} should hold the full sum of chunk {r}")


def _phase_bytes(sizes: list[int], skip: int, element_size: int) -> int:
    return (sum(sizes) - sizes[skip]) * element_size


def name_bytes_mistake(got: list[int], numel: int, world_size: int, element_size: int) -> None:
    """Raise with a hint naming the mistake ``got`` made, if it is one we know."""
    n, size = world_size, element_size
    sizes = [b - a for a, b in chunk_bounds(numel, n)]
    expect(n > 1 or got == [0], f"alone (world_size 1) a rank has no one to send to; you "
                                f"counted {got[0]} bytes")
    expect(got != ring_viz.bytes_sent_per_rank(numel, n, 1),
           "those are elements, not bytes: each element is element_size bytes")
    expect(got != [2 * (n - 1) * numel * size] * n,
           "that is a whole tensor in every step; a ring step sends one chunk")
    expect(got != [_phase_bytes(sizes, r, size) for r in range(n)],
           "that counts the reduce-scatter only: the all-gather sends chunks too")
    expect(len(set(got)) > 1 or numel % n == 0,
           f"every rank got the same count, but {numel} elements do not split evenly over "
           f"{n} ranks: chunks differ in size, and so do the ranks' counts")
    expect(False, f"numel={numel}, world_size={n}, element_size={size}: expected "
                  f"{ring_viz.bytes_sent_per_rank(numel, n, size)}, got {got}. Count the "
                  "chunks rank r sends in each phase, and which ones it does not send")


@exercise("6.2")
def ring_bytes(count_fn) -> None:
    """``count_fn(numel, world_size, element_size)``: bytes each rank sends in the ring."""
    library = [ring_viz.bytes_sent_per_rank, network_sim.simulate]
    cases = ((4000, 4, 4), (4001, 4, 4), (10, 3, 8), (3, 4, 4), (7, 2, 2), (100, 1, 4))
    for numel, world_size, element_size in cases:
        got = call_own(count_fn, numel, world_size, element_size, library=library)
        what = f"return one number per rank: a list of {world_size} for {world_size} ranks"
        expect_type(got, (list, tuple), what)
        expect(len(got) == world_size, f"{what}, not {len(got)}")
        for value in got:
            expect_type(value, (int, float), f"{what}, each a whole number of bytes")
        got = [int(v) for v in got]
        if got != ring_viz.bytes_sent_per_rank(numel, world_size, element_size):
            name_bytes_mistake(got, numel, world_size, element_size)


# ---- the ring all-reduce: the learner's own file, launched on 2, 3 and 4 processes --------

MY_RING_FILE = "workspace/my_ring.py"
RING_CASES = "course_lib.check.cases.ring_cases"
RING_ADVICE = Advice(
    all_send="In a ring every rank sends and receives in each step, so each rank's receive "
             "must already be under way while it waits for its send to complete.",
    all_recv="In a ring every rank sends and receives in each step, so each rank's send must "
             "already be under way while it waits for its receive.",
    mismatch="Both ends of each message must agree: in every step each rank sends to its "
             "right-hand neighbour and receives from its left-hand one.",
    size="A receive buffer must match its message: either the two ranks meant different "
         "chunks (or cut the tensor differently), or the buffer has another dtype than the "
         "tensor (torch.empty and torch.zeros make float32 unless told otherwise).")


def explain_ring_error(error: dict, text: str) -> str:
    if "out of range" in error["message"] and ".chunk(" in text:
        return ("torch.chunk can return fewer than N chunks (2 numbers in 3 chunks gives 2), "
                "but the ring needs N chunks on every rank, some of them empty.")
    return ""


def judge_ring_calls(rank: int, s: dict) -> None:
    """No library all-reduce, no collective: the ring is made of point-to-point messages."""
    expect(not s["library"], f"ring_all_reduce calls the library's {(s['library'] or [''])[0]}"
                             ": the point is to write the ring yourself, from dist.isend and "
                             "dist.irecv")
    expect(not s["collectives"], f"ring_all_reduce calls dist.{(s['collectives'] or [''])[0]}"
                                 ": build it from dist.isend and dist.irecv only (a "
                                 "reduce-scatter, then an all-gather, round the ring)")
    for handle in s["unwaited"]:
        way = "to" if handle["kind"] == "isend" else "from"
        expect(False, f"rank {rank} returned without waiting for its {handle['kind']} {way} "
                      f"rank {handle['peer']} (line {handle['line']}): until its handle is "
                      "waited on, a message may not have arrived (or left) yet")


def _values(by_rank: dict, key: str, n: int) -> list[torch.Tensor]:
    return [torch.tensor(by_rank[r][key], dtype=torch.float64) for r in range(n)]


def _unchanged(spec: dict, by_rank: dict, rank: int) -> None:
    """The caller's tensor came back as it went in, on every rank: say why."""
    expect(not spec["transposed"],
           "a non-contiguous tensor came back unchanged: flattening it (reshape, flatten or "
           "contiguous) made a copy, and the sum stayed in that copy; ring_all_reduce works "
           "in place, on the tensor it is given")
    other = by_rank[rank]["returned_other"]
    expect(other is None or other != by_rank[rank]["expected"],
           "the sum is in the tensor you returned, not in the caller's tensor: "
           "ring_all_reduce works in place, on the tensor it is given")
    expect(False, "the caller's tensor is unchanged on every rank: ring_all_reduce must "
                  "leave the sum in the tensor it is given, in place")


def judge_ring_values(spec: dict, by_rank: dict, n: int) -> None:
    """The sum on every rank, in the caller's tensor; a wrong one named by its mistake."""
    inputs, got = _values(by_rank, "input", n), _values(by_rank, "got", n)
    expected = _values(by_rank, "expected", n)
    wrong = [r for r in range(n) if not torch.equal(got[r], expected[r])]
    if not wrong:
        return
    if all(torch.equal(g, x) for g, x in zip(got, inputs, strict=True)):
        _unchanged(spec, by_rank, wrong[0])
    mistake = ring_mistakes.name_mistake(inputs, got)
    if mistake:
        expect(False, ring_mistakes.mistake_hint(mistake, n))
    r = wrong[0]
    expect(False, f"rank {r} holds {_short(got[r])}, dist.all_reduce gives "
                  f"{_short(expected[r])}, and no mistake the checker knows gives these "
                  "numbers: follow one chunk through the ring, which rank sends it in each "
                  "step and into which chunk the receiver adds (or stores) it")


def _short(values: torch.Tensor) -> str:
    shown = [int(v) if float(v).is_integer() else round(float(v), 3) for v in values[:6]]
    return str(shown)[:-1] + (", ...]" if values.numel() > 6 else "]")


def judge_ring_bytes(by_rank: dict, n: int) -> None:
    """Each rank sends 2(N-1)/N of the tensor, give or take one chunk, however it is cut."""
    numel, size = by_rank[0]["numel"], by_rank[0]["element_size"]
    sent = [by_rank[r]["bytes_sent"] for r in range(n)]
    whole = 2 * (n - 1) * numel * size  # the whole tensor in each of the 2(N-1) steps
    share = whole / n  # one chunk per step: the bandwidth-optimal share of any all-reduce
    chunk = -(-numel // n) * size  # the largest chunk of an even cut: numel / N, rounded up
    far = [r for r in range(n) if abs(sent[r] - share) > chunk]
    if not far:
        return
    expect(not all(b >= whole for b in sent),
           f"each rank sent {sent[0]} bytes for a {numel * size}-byte tensor: the whole "
           "tensor in every step. A ring step sends one chunk, so that each rank sends "
           "2(N-1)/N of the tensor in all")
    r = far[0]
    expect(False, f"rank {r} sent {sent[r]} bytes for a {numel * size}-byte tensor on {n} "
                  f"ranks, {'more' if sent[r] > share else 'less'} than a ring sends: "
                  f"2(N-1)/N of the tensor, {share:g} bytes here, give or take one chunk "
                  f"({chunk} bytes), however the chunks are cut. In a ring every rank sends "
                  "one chunk per step, N - 1 steps in each phase")


def judge_ring_case(summary: dict, by_rank: dict, run) -> None:
    n = summary["ranks"]
    spec = {s["name"]: s for s in ring_cases.case_specs(run.world_size, {})}[summary["name"]]
    for rank in range(n):
        judge_ring_calls(rank, by_rank[rank])
    judge_ring_values(spec, by_rank, n)
    judge_ring_bytes(by_rank, n)


@exercise("6.3")
def my_ring(path: str = MY_RING_FILE, world_sizes=WORLD_SIZES) -> None:
    """``ring_all_reduce(tensor, group=None)`` in the learner's file: in place, the SUM, from
    point-to-point messages, each rank sending about 2(N-1)/N of the tensor."""
    learner = find_learner_file(path, ("ring_all_reduce",))
    used = ring_mistakes.library_call(path)
    expect(used is None, f"ring_all_reduce calls {used}: the point is to write the ring "
                         "yourself, from dist.isend and dist.irecv")
    check_file(learner, RING_CASES, {}, world_sizes, RING_ADVICE, judge_ring_case,
               explain_ring_error)
    record_pass("6.3", path)
