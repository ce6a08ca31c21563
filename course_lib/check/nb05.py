"""Checkers for the exercises of notebook 05 (processes and collectives)."""

from __future__ import annotations

import math

from course_lib.check.answers import expect_type
from course_lib.check.checker import exercise, expect
from course_lib.check.mp import token_ring_cases
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import call_own
from course_lib.demos.collectives_tour import expected_after, start_values
from course_lib.lessons.cost_model import fit_alpha_beta
from course_lib.runtime.workspace import record_pass

TOKEN_RING_CASES = "course_lib.check.mp.token_ring_cases"

CASES = (  # (what each rank holds before) for 2, 3 and 4 ranks, small whole numbers
    [start_values(r, 2) for r in range(2)],
    [start_values(r, 3) for r in range(3)],
    [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [0.0, 0.0, 0.0, 1.0], [2.0, 0.0, 2.0, 0.0]],
)


REDUCE_SCATTER_HINT = (
    "Draw `before` as a table, one row per rank and one column per chunk. A reduce-scatter adds "
    "up each column over all the ranks, and each rank keeps one of the column totals: rank r "
    "keeps column r's, as a list of one number. So the answer has N lists of one number each.")


def _row_sums(before) -> list[list[float]]:
    return [[float(sum(row))] for row in before]


@exercise("5.1", pointer=REDUCE_SCATTER_HINT)
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


FIT_HINT = ("Both times are alpha plus beta times the bytes. Subtract one from the other: alpha "
            "cancels, and what is left is beta times the difference in bytes, so divide. "
            "Then alpha is what remains of t1 once you take away the cost of its n1 bytes.")


@exercise("5.2", pointer=FIT_HINT)
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
TOKEN_RING_ADVICE = {
    "pass_token": Advice(
        all_send="Let even ranks send first and odd ranks receive first: each send then meets "
                 "a recv that is already waiting (this works for odd N too).",
        all_recv="Someone has to send first: let even ranks send first and odd ranks receive "
                 "first.",
        mismatch="Every send needs a matching recv on the rank it names, and every recv a "
                 "matching send: each rank sends to (rank + 1) % N and receives from "
                 "(rank - 1) % N.",
        size="Receive into a tensor exactly like the token: torch.empty_like(token)."),
    "pass_token_async": Advice(
        all_send="Start both messages, isend and irecv, before waiting on either.",
        all_recv="Start both messages, isend and irecv, before waiting on either.",
        mismatch="Every isend needs a matching irecv on the rank it names, and every irecv "
                 "a matching isend: each rank sends to (rank + 1) % N and receives from "
                 "(rank - 1) % N.",
        size="Receive into a tensor exactly like the token: torch.empty_like(token)."),
}


def explain_token_error(error: dict, text: str) -> str:
    if "should not be the same as the rank" in error["message"]:
        return ("With a single process, rank 0 is its own neighbour and cannot send to itself: "
                "when dist.get_world_size(group) is 1, return token.clone().")
    return ""


def judge_messages(function: str, rank: int, s: dict) -> None:
    """The calls a rank made: the right kind of messages, every handle waited on."""
    used = s["collectives"] + s["library"]
    expect(not used, f"{function} calls {used[0] if used else ''}: pass the token with "
                     "point-to-point messages to the right neighbour only")
    if function == "pass_token":
        expect(not set(s["calls"]) & {"isend", "irecv", "batch"},
               "pass_token is the blocking version: use dist.send and dist.recv, in an order "
               "that cannot deadlock (isend and irecv belong in pass_token_async)")
    else:
        expect(not set(s["calls"]) & {"send", "recv"},
               "pass_token_async must not block in send or recv: start the messages with "
               "dist.isend and dist.irecv, then wait on both handles")
    for handle in s["unwaited"]:
        way = "to" if handle["kind"] == "isend" else "from"
        expect(False, f"rank {rank} returned without waiting for its {handle['kind']} {way} "
                      f"rank {handle['peer']} (line {handle['line']}): until .wait() returns, "
                      "an irecv's tensor may not hold the data yet and an isend's tensor may "
                      "still be in use; wait on every handle before returning")


def judge_token(function: str, spec: dict, rank: int, s: dict) -> None:
    """One rank's answer in one case."""
    n, ret, mine = spec["ranks"], s["returned"], token_ring_cases.make_token(spec, rank)
    judge_messages(function, rank, s)
    expect(ret["tensor"], f"{function} returned {ret.get('type')} on rank {rank}: return the "
                          "tensor received from the left neighbour")
    expect(ret["shape"] == list(mine.shape) and ret["dtype"] == str(mine.dtype)[6:],
           f"rank {rank} returned a tensor of shape {tuple(ret['shape'])} and dtype "
           f"{ret['dtype']}, the token has shape {tuple(mine.shape)} and dtype "
           f"{str(mine.dtype)[6:]}: receive into torch.empty_like(token)")
    got, left = ret["values"], (rank - 1) % n
    if n == 1:
        expect(got == mine.flatten().tolist() and not ret["is_token"],
               "with a single process the token comes back to its owner: return "
               "token.clone(), a copy, not the token itself")
    else:
        expect(got != mine.flatten().tolist(), f"rank {rank} returned its own token: return "
                                               f"the tensor received from rank {left}")
        right = token_ring_cases.make_token(spec, (rank + 1) % n).flatten().tolist()
        expect(n < 3 or got != right,
               f"rank {rank} got the token of rank {(rank + 1) % n}, its right neighbour: "
               "the token goes the other way round; send to (rank + 1) % N and receive from "
               "(rank - 1) % N")
        want = token_ring_cases.make_token(spec, left).flatten().tolist()
        expect(got == want, f"rank {rank} returned {got}, not the token of rank {left} {want}")
    expect(not s["token_changed"], f"{function} changed the caller's token on rank {rank}: "
                                   "receive into a new tensor, torch.empty_like(token)")
    expect(s["messages"] == int(n > 1), f"rank {rank} sent {s['messages']} messages: the ring "
                                     "needs one send, of the token, to the right neighbour")


def _check_token_ring(function: str, path: str, world_sizes) -> None:
    learner = find_learner_file(path, (function,))
    options = {"function": function}
    specs = {}

    def judge_case(summary, by_rank, run):
        if run.world_size not in specs:
            specs[run.world_size] = {s["name"]: s for s in
                                     token_ring_cases.case_specs(run.world_size, options)}
        for rank, s in sorted(by_rank.items()):
            judge_token(function, specs[run.world_size][summary["name"]], rank, s)

    check_file(learner, TOKEN_RING_CASES, options, world_sizes,
               TOKEN_RING_ADVICE[function], judge_case, explain_token_error)


@exercise("5.3")
def token_ring(path: str = TOKEN_RING_FILE, world_sizes=WORLD_SIZES) -> None:
    """``pass_token(token, group)`` in the learner's file, with blocking send/recv."""
    _check_token_ring("pass_token", path, world_sizes)
    record_pass("5.3", path)


@exercise("5.4")
def token_ring_async(path: str = TOKEN_RING_FILE, world_sizes=WORLD_SIZES) -> None:
    """``pass_token_async(token, group)`` in the learner's file, with isend/irecv."""
    _check_token_ring("pass_token_async", path, world_sizes)
    record_pass("5.4", path)
