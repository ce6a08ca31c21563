"""Checkers for the exercises of notebook 06 (all-reduce from scratch)."""

from __future__ import annotations

import torch

from course_lib.check.core import exercise, expect
from course_lib.check.mp import ring_cases, ring_mistakes
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.core.collectives import chunk_bounds
from course_lib.lessons import ring_viz
from course_lib.runtime.workspace import record_pass

RS_HINT = ("in reduce-scatter step s, rank r sends chunk (r - s - 1) mod N to rank (r + 1) mod N, "
           "which adds it to its own copy of that chunk")


def random_chunks(world_size: int, numel: int, seed: int) -> list[list[torch.Tensor]]:
    """chunks[r][c]: rank r's copy of chunk c, chunk sizes as chunk_bounds cuts them."""
    g = torch.Generator().manual_seed(seed)
    flat = [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(world_size)]
    return [[f[a:b].clone() for a, b in chunk_bounds(numel, world_size)] for f in flat]


def copy_chunks(chunks):
    return [[c.clone() for c in row] for row in chunks]


def same_chunks(a, b) -> bool:
    pairs = [(x, y) for row_a, row_b in zip(a, b, strict=True)
             for x, y in zip(row_a, row_b, strict=True)]
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=1e-12, atol=1e-12)
               for x, y in pairs)


def well_formed(got, world_size: int) -> bool:
    return (isinstance(got, (list, tuple)) and len(got) == world_size
            and all(isinstance(row, (list, tuple)) and len(row) == world_size
                    and all(isinstance(c, torch.Tensor) for c in row) for row in got))


def ring_step(chunks, step: int, combine):
    rs = ring_viz.RingStep(ring_viz.REDUCE_SCATTER, step,
                           tuple(ring_viz.send_chunk(r, step, len(chunks), ring_viz.REDUCE_SCATTER)
                                 for r in range(len(chunks))))
    return ring_viz.apply_step(chunks, rs, combine)


def check_one_step(step_fn, state, step: int):
    """Run the learner's step on a copy; return its result, or raise with a pointed hint."""
    n = len(state)
    got = step_fn(copy_chunks(state), step)
    expect(well_formed(got, n), f"return the chunks after the step: a list of {n} lists "
                                f"(one per rank) of {n} chunk tensors each")
    expected = ring_step(state, step, lambda mine, incoming: mine + incoming)
    if not same_chunks(got, expected):
        replaced = ring_step(state, step, lambda mine, incoming: incoming.clone())
        expect(not same_chunks(got, replaced),
               "the receiver replaced its copy with the incoming chunk: in reduce-scatter it "
               "must add the incoming chunk to its own copy")
        expect(False, f"step {step} with {n} ranks gave other chunks than expected: {RS_HINT}")
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
                   f"after N-1 steps rank {r} should hold the full sum of chunk {r}: {RS_HINT}")


@exercise("6.2")
def ring_bytes(count_fn) -> None:
    """``count_fn(numel, world_size, element_size)``: bytes each rank sends in the ring."""
    cases = ((4000, 4, 4), (4001, 4, 4), (10, 3, 8), (3, 4, 4), (7, 2, 2), (100, 1, 4))
    for numel, world_size, element_size in cases:
        got = count_fn(numel, world_size, element_size)
        want = ring_viz.bytes_sent_per_rank(numel, world_size, element_size)
        expect(isinstance(got, (list, tuple)) and len(got) == world_size,
               f"return one number per rank: {world_size} numbers for {world_size} ranks")
        got = [int(v) for v in got]
        elements = ring_viz.bytes_sent_per_rank(numel, world_size, 1)
        expect(got != elements or got == want,
               "those are elements, not bytes: multiply by element_size")
        expect(got == want, f"numel={numel}, world_size={world_size}, element_size="
                            f"{element_size}: expected {want}, got {got}. Rank r sends every "
                            "chunk but chunk r in reduce-scatter and every chunk but chunk "
                            "r + 1 in all-gather; use chunk_bounds for the real chunk sizes "
                            "(they differ when N does not divide numel)")


# ---- the ring all-reduce: the learner's own file, launched on 2, 3 and 4 processes --------

MY_RING_FILE = "workspace/my_ring.py"
RING_CASES = "course_lib.check.mp.ring_cases"
RING_STEPS = ("in reduce-scatter step s, rank r sends chunk (r - s - 1) % N to rank (r + 1) % N "
              "and adds the chunk it receives into chunk (r - s - 2) % N; in all-gather step "
              "s it sends chunk (r - s) % N and receives chunk (r - s - 1) % N")
RING_ADVICE = Advice(
    all_send="Start each step's receive and send together with dist.irecv and dist.isend, "
             "then wait on both.",
    all_recv="Start each step's receive and send together with dist.irecv and dist.isend, "
             "then wait on both.",
    mismatch=f"Both ends of each message must agree: {RING_STEPS}.",
    size="Sender and receiver must agree on the chunk of each step, cut the same way on every "
         f"rank (torch.tensor_split(flat, N)): {RING_STEPS}.")


def explain_ring_error(error: dict, text: str) -> str:
    if "out of range" in error["message"] and ".chunk(" in text:
        return ("torch.chunk can return fewer than N chunks (2 numbers in 3 chunks gives 2); "
                "torch.tensor_split(flat, N) always returns N, some of them empty.")
    return ""


def judge_ring_calls(rank: int, s: dict) -> None:
    expect(not s["library"], f"ring_all_reduce calls the library's {(s['library'] or [''])[0]}"
                             ": the point is to write the ring yourself, from dist.isend and "
                             "dist.irecv")
    expect(not s["collectives"], f"ring_all_reduce calls dist.{(s['collectives'] or [''])[0]}"
                                 ": build it from dist.isend and dist.irecv only (reduce-scatter"
                                 ", then all-gather round the ring)")
    for handle in s["unwaited"]:
        way = "to" if handle["kind"] == "isend" else "from"
        expect(False, f"rank {rank} returned without waiting for its {handle['kind']} {way} "
                      f"rank {handle['peer']} (line {handle['line']}): wait on every handle "
                      "before using the chunk or returning")


def _values(by_rank: dict, key: str, n: int) -> list[torch.Tensor]:
    return [torch.tensor(by_rank[r][key], dtype=torch.float64) for r in range(n)]


def judge_ring_values(spec: dict, by_rank: dict, n: int) -> None:
    inputs, got = _values(by_rank, "input", n), _values(by_rank, "got", n)
    expected = _values(by_rank, "expected", n)
    wrong = [r for r in range(n) if not torch.equal(got[r], expected[r])]
    if not wrong:
        return
    if all(torch.equal(g, x) for g, x in zip(got, inputs, strict=True)):
        expect(not spec["transposed"],
               "a non-contiguous tensor came back unchanged: tensor.reshape(-1) (or "
               ".contiguous()) made a copy; copy the result back into the caller's tensor "
               "with tensor.copy_(flat.view(tensor.shape))")
        other = by_rank[wrong[0]]["returned_other"]
        expect(other is None or other != by_rank[wrong[0]]["expected"],
               "the sum is in the tensor you returned, not in the caller's tensor: "
               "ring_all_reduce works in place, on the tensor it is given")
        expect(False, "the caller's tensor is unchanged on every rank: ring_all_reduce must "
                      "leave the sum in the tensor it is given, in place")
    mistake = ring_mistakes.name_mistake(inputs, got)
    if mistake:
        expect(False, ring_mistakes.mistake_hint(mistake, n))
    r = wrong[0]
    expect(False, f"rank {r} holds {_short(got[r])}, dist.all_reduce gives "
                  f"{_short(expected[r])}: {RING_STEPS}")


def _short(values: torch.Tensor) -> str:
    shown = [int(v) if float(v).is_integer() else round(float(v), 3) for v in values[:6]]
    return str(shown)[:-1] + (", ...]" if values.numel() > 6 else "]")


def judge_ring_bytes(by_rank: dict, n: int) -> None:
    numel, size = by_rank[0]["numel"], by_rank[0]["element_size"]
    chunks = [end - start for start, end in chunk_bounds(numel, n)]
    valid = [[(2 * numel - chunks[(r + k) % n] - chunks[(r + k + 1) % n]) * size * (n > 1)
              for r in range(n)] for k in range(n)]
    sent = [by_rank[r]["bytes_sent"] for r in range(n)]
    if sent in valid:
        return
    whole = 2 * (n - 1) * numel * size
    expect(not all(b >= whole for b in sent) or whole == 0,
           f"each rank sent {sent[0]} bytes for a {numel * size}-byte tensor: every step sends "
           "the whole tensor; send one chunk per step (torch.tensor_split(flat, N)), so that "
           "a rank sends 2(N-1)/N of the tensor in all")
    r = next(r for r in range(n) if sent[r] != valid[0][r])
    expect(False, f"rank {r} sent {sent[r]} bytes; a ring sends one chunk per step, "
                  f"2(N-1)/N of the tensor: {valid[0][r]} bytes here, with chunks cut as "
                  "torch.tensor_split(flat, N) cuts them")


def judge_ring_case(summary: dict, by_rank: dict, run) -> None:
    n = summary["ranks"]
    spec = {s["name"]: s for s in ring_cases.case_specs(run.world_size, {})}[summary["name"]]
    for rank in range(n):
        judge_ring_calls(rank, by_rank[rank])
    judge_ring_values(spec, by_rank, n)
    judge_ring_bytes(by_rank, n)


@exercise("6.3")
def my_ring(path: str = MY_RING_FILE, world_sizes=WORLD_SIZES) -> None:
    """``ring_all_reduce(tensor, group=None)`` in the learner's file: in place, the SUM."""
    learner = find_learner_file(path, ("ring_all_reduce",))
    check_file(learner, RING_CASES, {}, world_sizes, RING_ADVICE, judge_ring_case,
               explain_ring_error)
    record_pass("6.3", path)
