"""Exercises 5.3 and 5.4, the token ring: ``pass_token(token, group)`` (blocking send/recv) and
``pass_token_async`` (isend/irecv) in the learner's file, on 2, 3 and 4 processes.

Rank side: every rank passes its own token to the right; each case uses another shape and
dtype. Tokens are whole numbers, different on every rank (rank r's lie in 100 r + 1 .. 100 r +
99), so that the judge can tell whose token a rank got back and, when the function wrote into
the token it was given, whose token it holds now. On 2 processes a last case gives the function
a group of rank 0 alone, on 3 and 4 a group of ranks [1, 2] or [1, 3], where a peer named by its
global rank (``dst=``, not ``group_dst=``) is not the one meant. ``options["function"]`` names
the function.

Kernel side: the judge reads what every rank called, returned and left in its token.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from course_lib.check.cases import expect_waited, members, with_group_case
from course_lib.check.checker import expect
from course_lib.check.mp.groups import ALONE_IN_GROUP, PeerOutsideGroup
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import COLLECTIVES, Tracer
from course_lib.check.mp.verdict import Advice

CASES = (  # (name, shape, dtype)
    ("a float32 token of 3 numbers", [3], "float32"),
    ("an int64 token of shape (2, 2)", [2, 2], "int64"),
    ("a 0-d float64 token", [], "float64"),
)
ONE_PROCESS = ("a float32 token of 2 numbers, in a group of 1 process", [2], "float32")
NOT_CONNECTED = "Pair is not connected"  # Gloo, for an isend or irecv to the process itself


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": name, "shape": shape, "dtype": dtype} for name, shape, dtype in CASES]
    if world_size == 2:
        name, shape, dtype = ONE_PROCESS
        specs.append({"name": name, "shape": shape, "dtype": dtype, "members": [0]})
    return with_group_case(specs, world_size, {"name": "a float64 token of 4 numbers",
                                               "shape": [4], "dtype": "float64"})


def make_token(spec: dict, rank: int) -> torch.Tensor:
    """Rank ``rank``'s token in case ``spec`` (its number in the case's group)."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + rank)
    values = torch.randint(1, 100, spec["shape"], generator=g) + 100 * rank
    return values.to(getattr(torch, spec["dtype"]))


def describe_value(value, token: torch.Tensor) -> dict:
    """What the learner's function returned, as JSON."""
    if not isinstance(value, torch.Tensor):
        return {"tensor": False, "type": type(value).__name__}
    return {"tensor": True, "shape": list(value.shape), "dtype": str(value.dtype)[6:],
            "values": value.detach().flatten().tolist(), "is_token": value is token}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    function = getattr(learner, options["function"])
    token = make_token(spec, dist.get_rank(group))
    before = token.clone()
    with tracer.watching(spec["name"], members(spec)) as log:
        try:
            returned = describe_value(function(token, group), token)  # read before any wait
        except RuntimeError as error:
            if NOT_CONNECTED in str(error):  # Gloo's own words start with its C++ source line
                error.args = (f"{NOT_CONNECTED}: Gloo has no connection from a process to "
                              "itself",)
            raise
    changed = not torch.equal(token, before)
    return {"returned": returned, "token_changed": changed,
            "token_now": token.flatten().tolist() if changed else None, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

RING_MATCH = ("each rank sends once, to its right-hand neighbour (r + 1) mod N, and receives "
              "once, from its left-hand neighbour (r - 1) mod N")
SIZE = ("The tensor a rank receives into must have the token's shape and dtype: neither travels "
        "with the message.")
ALONE = ("In a group of one process rank 0 is its own neighbour, and Gloo cannot send from a "
         "process to itself: alone on the ring, a rank gets its own token back, as a copy, "
         "without any message.")
POINT_TO_POINT = ("the token goes round with point-to-point messages, from each rank to its "
                  "neighbour only")
COLLECTIVE_USES = {f"torch.distributed.{name}": POINT_TO_POINT for name in COLLECTIVES}
WRONG_KIND = {  # function -> (calls it must not make, why)
    "pass_token": ({"isend", "irecv", "batch_isend_irecv", "batch"},
                   "exercise 5.3 is the blocking version, with dist.send and dist.recv only "
                   "(isend and irecv are exercise 5.4's)"),
    "pass_token_async": ({"send", "recv"}, "in exercise 5.4 every message is started with "
                                           "dist.isend or dist.irecv"),
}


def explain(error: dict, text: str) -> str:
    """One more line for an error of the one-process case (a rank sending to itself, or to
    a neighbour written as a number); none for a peer the tracer named otherwise."""
    if error["type"] == PeerOutsideGroup.__name__:
        return ALONE if ALONE_IN_GROUP in error["message"] else ""
    sends_to_itself = ("should not be the same as the rank", NOT_CONNECTED)
    return ALONE if any(s in error["message"] for s in sends_to_itself) else ""


def judge_calls(function: str, rank: int, s: dict) -> None:
    """The calls a rank made: the right kind of messages, every handle waited on."""
    used = s["collectives"] + s["library"]
    expect(not used, f"{function} calls {used[0] if used else ''}: {POINT_TO_POINT}")
    wrong, why = WRONG_KIND[function]
    made = sorted(set(s["calls"]) & wrong)
    expect(not made, f"{function} called {' and '.join(made)}: {why}")
    expect_waited(rank, s, "until its .wait() returns, an irecv's tensor may not hold the "
                           "message yet and an isend's tensor may still be in use")


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
                               "into the token it was given: the caller's own token is "
                               "overwritten, and it must come back as it was")
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
    token_bytes = s["bytes_sent"] // max(1, s["messages"])
    expect(s["messages"] == int(n > 1),
           f"rank {rank} sent {s['messages']} messages ({s['bytes_sent']} bytes): " + (
               "alone on the ring it sends none" if n == 1 else
               f"the ring needs one, of its token ({token_bytes} bytes), to its right-hand "
               f"neighbour rank {right}"))


def judge_case(function: str, spec: dict, by_rank: dict, run=None) -> None:
    """One case on every rank: what each called, returned and left in the token it was given."""
    n = len(by_rank)
    tokens = [make_token(spec, r).flatten().tolist() for r in range(n)]
    for rank, s in sorted(by_rank.items()):
        judge_calls(function, rank, s)
        judge_kind(function, rank, s, make_token(spec, rank))
    judge_callers_token(function, by_rank, tokens)
    got = [by_rank[r]["returned"]["values"] for r in range(n)]
    expect(n < 3 or got != [tokens[(r + 1) % n] for r in range(n)],
           "every rank got the token of its right-hand neighbour (rank 0 got rank 1's): the "
           "tokens went round the ring the wrong way; each one goes to the right, to rank "
           "(r + 1) mod N")
    for rank, s in sorted(by_rank.items()):
        judge_values(rank, s, tokens)


def _exercise(exercise_id: str, entry: str, file: str, function: str,
              advice: Advice) -> FileExercise:
    wrong, why = WRONG_KIND[function]
    kind = {f"torch.distributed.{name}": why for name in wrong}
    return FileExercise(exercise_id, file, (function,), __name__, advice,
                        functools.partial(judge_case, function),
                        library={**COLLECTIVE_USES, **kind}, explain=explain,
                        options={"function": function}, entry=f"check.nb05.{entry}")


TOKEN_RING = _exercise("5.3", "token_ring", "workspace/token_ring.py", "pass_token", Advice(
    all_send="Each rank waits in send for its right-hand neighbour, which waits in its own "
             "send for the next one, round the whole ring: a cycle of waits that no rank can "
             "leave.",
    all_recv="Each rank waits in recv for its left-hand neighbour, which waits in its own recv, "
             "round the whole ring: a cycle of waits, and no rank reaches its send.",
    mismatch=f"Every send needs a matching recv on the rank it names, and every recv a "
             f"matching send: {RING_MATCH}.", size=SIZE))
TOKEN_RING_ASYNC = _exercise("5.4", "token_ring_async", "workspace/token_ring_async.py",
                             "pass_token_async", Advice(
    all_send="Waiting on an isend's handle blocks like a send: every rank waits there before "
             "its irecv has started, so no message can arrive.",
    all_recv="Waiting on an irecv's handle blocks like a recv: every rank waits there before "
             "its isend has started, so nothing is ever sent.",
    mismatch=f"Every isend needs a matching irecv on the rank it names, and every irecv a "
             f"matching isend: {RING_MATCH}.", size=SIZE))
