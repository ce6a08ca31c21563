"""Checkers for the exercises of notebook 05 (processes and collectives)."""

from __future__ import annotations

import ast
import math

import torch

from course_lib.check.answers import expect_type
from course_lib.check.cases import token_ring_cases
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import call_own
from course_lib.lessons.collective_definitions import expected_after, start_values
from course_lib.lessons.cost_model import fit_alpha_beta
from course_lib.runtime.workspace import record_pass

CASES = (  # (what each rank holds before) for 2, 3 and 4 ranks, small whole numbers
    [start_values(r, 2) for r in range(2)],
    [start_values(r, 3) for r in range(3)],
    [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.0, 0.0, 0.0, 1.0], [2.0, 0.0, 2.0, 0.0]],
)


def _row_sums(before) -> list[list[float]]:
    return [[float(sum(row))] for row in before]


@exercise("5.1")
def reduce_scatter_by_hand(simulate) -> None:
    """``simulate(before)`` returns what every rank holds after a reduce-scatter."""
    library = [expected_after]
    for before in CASES:
        n = len(before)
        got = call_own(simulate, [list(row) for row in before], library=library)
        want = expected_after("reduce_scatter", before)
        expect_type(got, (list, tuple), f"return a list with one entry per rank ({n} entries "
                                        f"for {n} ranks)")
        expect(len(got) == n, f"return one entry per rank: {n} entries for {n} ranks, not "
                              f"{len(got)}")
        expect_type(got[0], (list, tuple), "each entry is the list of numbers that rank holds "
                                           "afterwards (a list, even of one number)")
        got = [[float(v) for v in row] for row in got]
        sums = [float(sum(col)) for col in zip(*before, strict=True)]
        expect(got != [sums] * n, "every rank holds every chunk's sum: that is all-reduce; "
                                  "after a reduce-scatter each rank keeps less than that")
        expect(all(len(row) == 1 for row in got),
               "each rank ends with one number (one chunk of the sum), not a whole tensor")
        expect(got != _row_sums(before), "each rank added up its own numbers: a reduction "
                                         "adds the same chunk across the ranks")
        expect(got != [[before[r][r]] for r in range(n)],
               "each rank kept its own number of its chunk: the other ranks' numbers of that "
               "chunk are missing")
        expect(sorted(got) != sorted([s] for s in sums) or got == want,
               "the right sums, on the wrong ranks: which chunk does each rank own?")
        expect(got == want, f"for {n} ranks starting from {before} expected {want}, got {got}")


@exercise("5.2")
def two_point_fit(fit) -> None:
    """``fit(n1, t1, n2, t2)`` returns ``(alpha, beta)`` of the line through both."""
    library = [fit_alpha_beta]
    for alpha, beta in ((50e-6, 1 / 2e9), (5e-6, 1 / 20e9), (1e-3, 1 / 1e8)):
        n1, n2 = 1024, 4 * 2**20
        t1, t2 = alpha + beta * n1, alpha + beta * n2
        got = call_own(fit, n1, t1, n2, t2, library=library)
        expect_type(got, (tuple, list), "return a pair (alpha, beta): two numbers")
        expect(len(got) == 2, f"return a pair (alpha, beta), two numbers, not {len(got)}")
        for value in got:
            expect_type(value, (int, float), "alpha and beta are plain numbers (seconds and "
                                             "seconds per byte)")
        got_alpha, got_beta = (float(v) for v in got)
        expect(not math.isclose(got_alpha, beta, rel_tol=1e-6),
               "alpha and beta are swapped: return (alpha, beta), latency first")
        expect(not math.isclose(got_beta, t2 / n2, rel_tol=1e-9),
               "beta is the large message's time per byte, its latency included: only the "
               "difference between the two measurements comes from the extra bytes")
        expect(math.isclose(got_beta, beta, rel_tol=1e-6),
               f"beta should be {beta:.3e} s/byte: how much longer each extra byte makes a "
               "message; compare the two measurements")
        expect(not math.isclose(got_alpha, t1, rel_tol=1e-9),
               "alpha is the whole time of the small message, but part of that time is its "
               "bytes: take their cost away")
        expect(math.isclose(got_alpha, alpha, rel_tol=1e-6),
               f"alpha should be {alpha:.3e} s: the time the line gives a message of 0 bytes")


# ---- the token ring: the learner's own file, launched on 2, 3 and 4 processes -------------

TOKEN_RING_FILE = "workspace/token_ring.py"
TOKEN_RING_ASYNC_FILE = "workspace/token_ring_async.py"
TOKEN_RING_CASES = "course_lib.check.cases.token_ring_cases"
RING_MATCH = ("each rank sends once, to its right-hand neighbour (r + 1) mod N, and receives "
              "once, from its left-hand neighbour (r - 1) mod N")
SIZE = ("The tensor a rank receives into must have the token's shape and dtype: neither travels "
        "with the message.")
TOKEN_RING_ADVICE = {
    "pass_token": Advice(
        all_send="Each rank waits in send for its right-hand neighbour, which waits in its own "
                 "send for the next one, round the whole ring: a cycle of waits that no rank "
                 "can leave.",
        all_recv="Each rank waits in recv for its left-hand neighbour, which waits in its own "
                 "recv, round the whole ring: a cycle of waits, and no rank reaches its send.",
        mismatch=f"Every send needs a matching recv on the rank it names, and every recv a "
                 f"matching send: {RING_MATCH}.",
        size=SIZE),
    "pass_token_async": Advice(
        all_send="Waiting on an isend's handle blocks like a send: every rank waits there "
                 "before its irecv has started, so no message can arrive.",
        all_recv="Waiting on an irecv's handle blocks like a recv: every rank waits there "
                 "before its isend has started, so nothing is ever sent.",
        mismatch=f"Every isend needs a matching irecv on the rank it names, and every irecv a "
                 f"matching isend: {RING_MATCH}.",
        size=SIZE),
}
ALONE = ("In a group of one process rank 0 is its own neighbour, and Gloo cannot send from a "
         "process to itself: alone on the ring, a rank gets its own token back, as a copy, "
         "without any message.")
SENDS_TO_ITSELF = ("should not be the same as the rank", token_ring_cases.NOT_CONNECTED)


def explain_token_error(error: dict, text: str) -> str:
    """One more line for an error of the one-process case (a rank sending to itself)."""
    return ALONE if any(s in error["message"] for s in SENDS_TO_ITSELF) else ""


WRONG_KIND = {  # function -> (calls it must not make, why)
    "pass_token": ({"isend", "irecv", "batch_isend_irecv", "batch"},
                   "pass_token called isend or irecv: exercise 5.3 is the blocking version, "
                   "with dist.send and dist.recv only (isend and irecv are exercise 5.4's)"),
    "pass_token_async": ({"send", "recv"},
                         "pass_token_async called the blocking send or recv: in exercise 5.4 "
                         "every message is started with dist.isend or dist.irecv"),
}


def called_in(path: str, function: str) -> set[str]:
    """The names ``function`` calls in the learner's file (``dist.isend(...)``: "isend"), read
    without running it; none when the file defines it other than with ``def``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    calls = [c.func for node in defined for c in ast.walk(node) if isinstance(c, ast.Call)]
    return {getattr(f, "attr", getattr(f, "id", "")) for f in calls}


def judge_calls(function: str, rank: int, s: dict) -> None:
    """The calls a rank made: the right kind of messages, every handle waited on."""
    used = s["collectives"] + s["library"]
    expect(not used, f"{function} calls {used[0] if used else ''}: the token goes round with "
                     "point-to-point messages, from each rank to its neighbour only")
    wrong, why = WRONG_KIND[function]
    expect(not set(s["calls"]) & wrong, why)
    for handle in s["unwaited"]:
        way = "to" if handle["kind"] == "isend" else "from"
        expect(False, f"rank {rank} returned without waiting for its {handle['kind']} {way} "
                      f"rank {handle['peer']} (line {handle['line']}): until its .wait() "
                      "returns, an irecv's tensor may not hold the message yet and an isend's "
                      "tensor may still be in use")


def judge_kind(function: str, rank: int, s: dict, mine: torch.Tensor) -> None:
    """A tensor of the token's shape and dtype."""
    ret = s["returned"]
    what = "None" if ret.get("type") == "NoneType" else f"a {ret.get('type')}"
    expect(ret["tensor"], f"{function} returned {what} on rank {rank}, not a tensor: it "
                          "returns the token its left-hand neighbour sent")
    dtype = str(mine.dtype).removeprefix("torch.")
    expect(ret["shape"] == list(mine.shape) and ret["dtype"] == dtype,
           f"rank {rank} returned a tensor of shape {tuple(ret['shape'])} and dtype "
           f"{ret['dtype']}, the token has shape {tuple(mine.shape)} and dtype {dtype}. {SIZE}")


def judge_callers_token(function: str, by_rank: dict, tokens: list[list]) -> None:
    """The token passed in comes back to the caller untouched, and is not what is returned."""
    for rank, s in sorted(by_rank.items()):
        holder = next((r for r, t in enumerate(tokens) if t == s["token_now"]), None)
        expect(holder is None, f"on rank {rank} {function} received rank {holder}'s token "
                               "into the token it was given, the one it sends: the caller's "
                               "own token is overwritten")
        expect(not s["token_changed"], f"on rank {rank} {function} wrote into the token it "
                                       "was given: the caller's token must come back as it "
                                       "was")
    for rank, s in sorted(by_rank.items()):
        left = (rank - 1) % len(tokens)
        expect(not s["returned"]["is_token"], f"rank {rank} returned the token it was given, "
               "the same tensor, " + ("not a copy: alone on the ring a rank gets a copy of its "
                                      "own token back" if len(tokens) == 1 else
                                      f"instead of the token of rank {left}, its left-hand "
                                      "neighbour"))


def judge_values(rank: int, s: dict, tokens: list[list]) -> None:
    """Rank ``rank`` returned its left-hand neighbour's token and sent one message."""
    n, got = len(tokens), s["returned"]["values"]
    left, right = (rank - 1) % n, (rank + 1) % n
    if n == 1:
        expect(got == tokens[0], f"alone on the ring rank 0 returned {got}, not a copy of its "
                                 f"own token {tokens[0]}")
    elif n == 2:
        expect(got != tokens[rank], f"rank {rank} got back its own token: it returned a copy "
                                    f"of it, or rank {left} sent on the token it had "
                                    "received instead of its own")
    else:
        expect(got != tokens[rank], f"rank {rank} returned a copy of its own token, not the "
                                    f"token it received from rank {left}")
    expect(got == tokens[left], f"rank {rank} returned {got}, not the token of rank {left}, "
                                f"{tokens[left]}")
    expect(s["messages"] == int(n > 1),
           f"rank {rank} sent {s['messages']} messages: " + (
               "alone on the ring it sends none" if n == 1 else
               "the ring needs one, of its token, to its right-hand neighbour "
               f"rank {right}"))


def judge_token_case(function: str, spec: dict, by_rank: dict) -> None:
    """One case on every rank: what each called, returned and left in the token it was given."""
    n = spec["ranks"]
    tokens = [token_ring_cases.make_token(spec, r).flatten().tolist() for r in range(n)]
    for rank, s in sorted(by_rank.items()):
        judge_calls(function, rank, s)
        judge_kind(function, rank, s, token_ring_cases.make_token(spec, rank))
    judge_callers_token(function, by_rank, tokens)
    got = [by_rank[r]["returned"]["values"] for r in range(n)]
    expect(n < 3 or got != [tokens[(r + 1) % n] for r in range(n)],
           "every rank got the token of its right-hand neighbour (rank 0 got rank 1's): the "
           "tokens went round the ring the wrong way; each one goes to the right, to rank "
           "(r + 1) mod N")
    for rank, s in sorted(by_rank.items()):
        judge_values(rank, s, tokens)


def _check_token_ring(function: str, path: str, world_sizes) -> None:
    learner = find_learner_file(path, (function,))
    wrong, why = WRONG_KIND[function]
    expect(not called_in(path, function) & wrong, why)  # seen in the file: no launch needed
    options = {"function": function}
    specs = {}

    def judge_case(summary, by_rank, run):
        if run.world_size not in specs:
            specs[run.world_size] = {s["name"]: s for s in
                                     token_ring_cases.case_specs(run.world_size, options)}
        judge_token_case(function, specs[run.world_size][summary["name"]], by_rank)

    check_file(learner, TOKEN_RING_CASES, options, world_sizes,
               TOKEN_RING_ADVICE[function], judge_case, explain_token_error)


@exercise("5.3")
def token_ring(path: str = TOKEN_RING_FILE, world_sizes=WORLD_SIZES) -> None:
    """``pass_token(token, group)`` in the learner's file, with blocking send/recv."""
    _check_token_ring("pass_token", path, world_sizes)
    record_pass("5.3", path)


@exercise("5.4")
def token_ring_async(path: str = TOKEN_RING_ASYNC_FILE, world_sizes=WORLD_SIZES) -> None:
    """``pass_token_async(token, group)`` in the learner's file, with isend/irecv."""
    _check_token_ring("pass_token_async", path, world_sizes)
    record_pass("5.4", path)
