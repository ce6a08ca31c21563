"""Judge how a launch of the learner's file ended, before looking at any value.

``raise_if_stopped`` raises ``NotImplementedError`` while the exercise is not done, and
``ExerciseError`` when a rank raised (the learner's own line, with the rank), when the ranks
deadlocked (who waited on whom, and why that cannot finish; who waits in a collective that
a peer called less often), when Gloo ended a rank for a message bigger than its buffer, or
when time ran out.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from course_lib.check.checker import ExerciseError
from course_lib.check.mp.learner import LearnerFile
from course_lib.check.mp.runner import Run

SIZE_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match")
SENDING = ("send", "isend")
SHAPE_ERRORS = ("must match the size of tensor", "shape mismatch", "size mismatch",
                "match the broadcast shape", "assign a gradient of size", "cannot be multiplied",
                "is invalid for input of size", "xpected size", "out of bounds",
                "does not match", "must have the same shape", "must have same shape",
                "must match the existing size", "expanded size")
SHAPES = ("A tensor of another size than the line expects: compare the shapes your function is "
          "handed (its docstring says them) with those this line makes.")
MEMBERSHIP = ("`in` compares a tensor with each item by value (==, number by number), not by "
              "identity: a tensor of another shape fails, and one of the same shape gives a "
              "tensor of booleans. Look a tensor up by identity (is) instead.")
AMBIGUOUS = "Boolean value of Tensor with more than one value is ambiguous"
GLOBAL_RANK = ("dst=, src= and a P2POp's peer are ranks of the whole world: in a group, name a "
               "rank by its number in the group, with group_dst=, group_src= or group_peer=.")


def is_shape_error(message: str) -> bool:
    """Whether torch raised ``message`` for tensors of sizes that do not fit together."""
    return any(words in message for words in SHAPE_ERRORS)


def tests_membership(source: str) -> bool:
    """Whether a line of code tests ``x in y`` (or ``not in``): with tensors, by value."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:  # a line of a longer statement
        return False
    return any(isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                     for op in node.ops)
               for node in ast.walk(tree))


@dataclass(frozen=True)
class Advice:
    """What to do, per kind of failure, in the words of one exercise."""

    all_send: str  # every rank sends first
    all_recv: str  # every rank receives first
    mismatch: str  # the sends and the receives do not pair up
    size: str  # a message arrived that is bigger than its receive buffer

    @classmethod
    def unpaired(cls, rule: str, calls: str = "messages", sent: str = "sent") -> Advice:
        """One rule for every kind: "The ranks' {calls} did not pair up: {rule}." (and "Two
        ranks {sent} tensors of different sizes: {rule}.")."""
        paired = f"The ranks' {calls} did not pair up: {rule}."
        return cls(all_send=paired, all_recv=paired, mismatch=paired,
                   size=f"Two ranks {sent} tensors of different sizes: {rule}.")


def where(run: Run, case: str | None) -> str:
    on = f"{run.world_size} process{'es' if run.world_size > 1 else ''}"
    return f"(case: {case}; launched on {on})" if case else f"(launched on {on})"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def learner_error_message(run: Run, learner: LearnerFile, explain=None) -> str | None:
    """The learner's exception on the lowest rank that raised one, or None;
    ``explain(error, file_text)`` may add a sentence for errors the exercise knows."""
    raised = [r for r in run.ranks if r.error and r.error["kind"] == "learner"]
    if not raised:
        return None
    e = raised[0].error
    same = [r.rank for r in raised[1:] if (r.error["type"], r.error["line"]) ==
            (e["type"], e["line"])]
    also = f" (and {_ranks(same)}, the same)" if same else ""
    at = f", {learner.path} line {e['line']}" if e["line"] else f", {learner.path}"
    inside = f" in {e['function']}" if e["function"] and e["function"] != "<module>" else ""
    source = f"\n    {e['source']}" if e["source"] else ""
    extra = (explain(e, _text(learner.path)) or "") if explain else ""
    if not extra and (is_shape_error(e["message"]) or AMBIGUOUS in e["message"]) and \
            tests_membership(e["source"]):
        extra = MEMBERSHIP
    if not extra and is_shape_error(e["message"]):
        extra = SHAPES
    if not extra and e["message"].startswith("Global rank"):  # "... is not part of group"
        extra = GLOBAL_RANK
    if not e.get("case") and not extra:  # raised while the file was imported
        extra = ("The checker imports the file, which runs its top-level code: keep code that "
                 "tries the functions out under `if __name__ == \"__main__\":`.")
    return (f"rank {raised[0].rank}{also}{at}{inside}:{source}\n{e['type']}: {e['message']}\n"
            f"{where(run, e.get('case'))}" + (f"\n{extra}" if extra else ""))


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _blocked_on(status: dict) -> tuple[str, int] | None:
    """(what, peer) a rank was blocked in: ("send", 1), ("irecv", 0)...; None if running."""
    op = status.get("op")
    if op is None or status.get("peer") is None:
        return None
    return (status.get("kind") or op, status["peer"]) if op == "wait" else (op, status["peer"])


def _at(status: dict) -> str:
    """Where a waiting rank was: ", inside ring_all_reduce (line 28)" when the op it waits
    in runs inside the course's function that the learner's line calls, else " (line 28)"."""
    inside = f", inside {status['inside']}" if status.get("inside") else ""
    return f"{inside} (line {status['line']})" if status.get("line") else inside


def _doing(what: str, peer: int) -> str:
    return f"{'sends to' if what in SENDING else 'receives from'} rank {peer}"


def _phrase(what: str, peer: int, first: bool) -> str:
    verb = {"send": "in send to", "recv": "in recv from", "isend": "waiting for its isend to",
            "irecv": "waiting for its irecv from"}.get(what, f"in {what} with")
    return f"{'is blocked ' if first else ''}{verb} rank {peer}"


def blocked_ranks(run: Run) -> dict[int, tuple[str, int]]:
    """{rank: (what, peer)} for every rank that stopped while waiting on a peer."""
    found, out_of_time = {}, "did not finish within" in (run.launch_error or "")
    for r in run.ranks:
        stopped = (not r.reported and (out_of_time or not run.launch_error)) or (
            r.error and r.error["kind"] in ("timeout", "peer_gone"))
        blocked = _blocked_on(r.status)
        if stopped and blocked:
            found[r.rank] = blocked
    return found


def _started(blocked: dict, run: Run) -> dict[int, list[tuple[str, int]]]:
    """{rank: [(what, peer)]}: the message each blocked rank waits on, then the isend/irecv
    it had started and not waited on yet (the tracer's "open")."""
    status = {r.rank: r.status for r in run.ranks}
    return {rank: [(what, peer)] + [(h["kind"], h["peer"])
                                    for h in status[rank].get("open", [])]
            for rank, (what, peer) in blocked.items()}


def _crossed(blocked: dict, run: Run) -> str | None:
    """When every blocked rank had started a send and a receive, so neither waits for the
    other: the send whose receiver waits for another rank instead, or None."""
    started = _started(blocked, run)
    if not all({what in SENDING for what, _ in mine} == {True, False}
               for mine in started.values()):
        return None
    for rank, mine in sorted(started.items()):
        for what, peer in mine:
            sources = [p for w, p in started.get(peer, []) if w not in SENDING]
            if what in SENDING and sources and rank not in sources:
                return (f"each rank had started its receive too, but not from the rank that "
                        f"sends to it: rank {rank} sends to rank {peer}, which receives from "
                        f"rank {sources[0]}")
    return None


def _reason(blocked: dict, run: Run, advice: Advice) -> str:
    crossed = _crossed(blocked, run)
    if crossed:
        return f"{crossed}. {advice.mismatch}"
    kinds = {what in SENDING for what, _ in blocked.values()}
    if len(blocked) == run.world_size and kinds == {True}:
        return ("every rank sends before any receives, so no send can complete (on Gloo a "
                "send returns only once the receiver has posted its recv, even for a single "
                f"number). {advice.all_send}")
    if len(blocked) == run.world_size and kinds == {False}:
        return f"every rank waits to receive before any rank sends. {advice.all_recv}"
    for rank, (what, peer) in blocked.items():
        other = blocked.get(peer)
        wants = "recv" if what in SENDING else "send"
        if other is None:
            return (f"rank {rank} {_doing(what, peer)}, but rank {peer} never posted the "
                    f"matching {wants}. {advice.mismatch}")
        if other[1] != rank or (other[0] in SENDING) == (what in SENDING):
            return (f"rank {rank} {_doing(what, peer)}, but rank {peer} "
                    f"{_doing(*other)}. {advice.mismatch}")
    return advice.mismatch


def deadlock_message(run: Run, learner: LearnerFile, advice: Advice) -> str | None:
    blocked = blocked_ranks(run)
    if not blocked:
        return None
    parts, status = [], {r.rank: r.status for r in run.ranks}
    for i, (rank, (what, peer)) in enumerate(sorted(blocked.items())):
        parts.append(f"rank {rank} {_phrase(what, peer, i == 0)}{_at(status[rank])}")
    case = next((r.status.get("case") for r in run.ranks if r.rank in blocked), None)
    return (f"{learner.path} never finished {where(run, case)}: {', '.join(parts)}: "
            f"{_reason(blocked, run, advice)}")


def _now(r) -> str | None:
    """Where a stopped rank was (which call, which line of the learner's file), if known."""
    status, blocked = r.status, _blocked_on(r.status)
    at = _at(status)
    if status.get("op") == "between cases":
        return f"rank {r.rank} had finished the case"
    if blocked:
        return f"rank {r.rank} {_phrase(*blocked, True)}{at}"
    if status.get("op"):
        return f"rank {r.rank} waits in {status['op']}{at}"
    if r.where.get("line"):
        return f"rank {r.rank} was at line {r.where['line']}: {r.where.get('source', '')}"
    return None


def _calls(r, op) -> int:
    """How often rank ``r`` had called collective ``op`` in its case (the tracer counts)."""
    return r.status.get("collectives", {}).get(op, 0)


def _waiting_for_peers(r, run: Run, learner: LearnerFile) -> str | None:
    """Rank ``r`` stopped in a collective that peers of its case called less often: they
    skipped it (under ``if rank == 0:``, say), so it can never complete."""
    op, case = r.status.get("op"), r.status.get("case")
    peers = [p for p in run.ranks if p.status.get("case") == case]
    behind = [p for p in peers if _calls(p, op) < _calls(r, op)]
    if not behind:
        return None
    waiting = [p.rank for p in peers if p.status.get("op") == op and p not in behind]
    never = all(not _calls(p, op) for p in behind)
    now = "; ".join(filter(None, (_now(p) for p in behind)))
    at = _at(r.status)
    return (f"{learner.path} never finished {where(run, case)}: {_ranks(waiting)} "
            f"wait{'s' if len(waiting) == 1 else ''} in {op}{at} for "
            f"{_ranks([p.rank for p in behind])}, which "
            f"{'never called it' if never else f'called {op} fewer times'} in this case"
            f"{': ' + now if now else ''}. A collective returns only once every rank of its "
            "group has called it")


def collective_message(run: Run, learner: LearnerFile) -> str | None:
    """Ranks stopped inside a collective: peers that called it less often, or every rank in
    the same call (their arguments disagree). None when no rank stopped in a collective."""
    stuck = [r for r in run.ranks if _calls(r, r.status.get("op")) and (
        not r.reported or (r.error or {}).get("kind") in ("timeout", "peer_gone"))]
    for r in stuck:
        message = _waiting_for_peers(r, run, learner)
        if message:
            return message
    calls = {(r.status.get("case"), r.status["op"], _calls(r, r.status["op"])) for r in stuck}
    if len(stuck) == run.world_size > 1 and len(calls) == 1:
        (case, op, _), = calls
        at = _at(stuck[0].status)
        return (f"{learner.path} never finished {where(run, case)}: every rank waits in "
                f"{op}{at}, the same call on each, and it never completed: their arguments "
                "disagree (the src or dst, the group or the size)")
    return None


def killed_message(run: Run, learner: LearnerFile, advice: Advice) -> str | None:
    """A rank that Gloo ended (SIGABRT): most often a message bigger than its buffer."""
    victim = next((r for r in run.ranks if not r.reported), None)
    text = run.launch_error or ""
    found = SIZE_MISMATCH.search(text)
    if victim is None or not (found or "SIGABRT" in text):
        return None
    what = _blocked_on(victim.status)
    way = "to" if what and what[0] in SENDING else "from"
    during = f" in {what[0]} {way} rank {what[1]}" if what else ""
    line = _at(victim.status)
    why = (f"a {found.group(1)}-byte message arrived for a {found.group(2)}-byte receive buffer"
           if found else "Gloo aborts a process that gets a message bigger than the buffer "
                         "it posted for it")
    return (f"rank {victim.rank} was ended by Gloo{during}{line}: {why} "
            f"{where(run, victim.status.get('case'))}. {advice.size}")


def time_out_message(run: Run, learner: LearnerFile) -> str | None:
    if not run.launch_error or "did not finish within" not in run.launch_error:
        return None
    running = [r for r in run.ranks if not r.reported]
    parts = []
    for r in running:
        line, source = r.where.get("line"), r.where.get("source", "")
        parts.append(f"rank {r.rank} was still at {learner.path} line {line}: {source}"
                     if line else f"rank {r.rank} had not started the learner's code")
    return (f"{learner.path} did not finish within {run.seconds:.0f} s and was stopped; "
            + "; ".join(parts) + ". A loop that never ends (e.g. polling is_completed() on "
            "a message nobody sends) looks like this")


def raise_if_stopped(run: Run, learner: LearnerFile, advice: Advice, explain=None) -> None:
    """Raise for a run that did not go through every case; return quietly otherwise."""
    errors = [r.error for r in run.ranks if r.error]
    if any(e["kind"] == "not_done" for e in errors):
        raise NotImplementedError(learner.path)
    raised = learner_error_message(run, learner, explain)
    if raised:
        raise ExerciseError(raised, raised=True)
    found = next((e for e in errors if e["kind"] == "finding"), None)
    if found:  # a case saw what the learner's code left, and could not go on
        raise ExerciseError(f"{found['message']} {where(run, found.get('case'))}")
    if not errors and all(r.reported for r in run.ranks):
        return  # every rank finished every case; a launch that ended late (a busy machine)
        # changes nothing the cases found
    for message in (collective_message(run, learner),
                    killed_message(run, learner, advice),
                    deadlock_message(run, learner, advice), time_out_message(run, learner)):
        if message:
            raise ExerciseError(message)
    checker = [e for e in errors if e["kind"] == "checker"]
    if checker or run.launch_error or any(not r.reported for r in run.ranks):
        details = checker[0].get("traceback", "") if checker else run.launch_error
        raise RuntimeError(f"the checker itself failed on {run.world_size} processes; "
                           f"please report this:\n{details}")
    if errors:  # a peer-gone or timeout without a blocked rank to blame
        e = errors[0]
        raise ExerciseError(f"{e['type']}: {e['message']} {where(run, e.get('case'))}")
