"""Watch the learner's messages inside a checked run (one ``Tracer`` per rank).

``Tracer.install`` replaces ``torch.distributed``'s point-to-point calls (``send``, ``recv``,
``isend``, ``irecv``, ``batch_isend_irecv``), its collectives and the library's all-reduces
with wrappers. While a case runs (``with tracer.watching(case, members) as log``) they

- write, before anything that blocks, what this rank waits for and for which peer to
  ``status{R}.json`` in the run folder ({"op": "send", "peer": 1, "line": 9, "open": [the
  isend/irecv handles it has not waited on yet], ...}), so that the checker can name who
  waited on whom, and who had started which message, even when the rank is stopped;
- write a collective there too ({"op": "broadcast", "line": 17, "root": "src=0"}), and in
  every status how often this rank called each collective in the case ("collectives"): a
  rank that called one less often than its peers leaves them waiting;
- count the bytes and messages this rank sends, note every collective and library call (with
  the dtype and size of the tensor it was handed), and hand out ``isend``/``irecv`` handles,
  and those of collectives started with ``async_op=True``, that remember whether they were
  waited on;
- refuse a peer outside the group the case passed, a peer or a root named by its rank in
  the whole world (dst=, src=) in a group numbered otherwise, group_dst= without group=, and
  a collective on the whole world when the case passed a smaller group, before any handler
  (a clear error, not a hang: ``groups.py``).

Outside ``watching`` (the checker's own calls) the wrappers only pass the call on. A thread
(``watch.py``) writes the learner's current line to ``where{R}.json`` and ends the ranks when
every one of them waits and none can move.
"""

from __future__ import annotations

import ast
import collections
import datetime
import functools
import importlib
import inspect
import linecache
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from course_lib.check.mp import groups
from course_lib.check.mp.groups import GroupChecks
from course_lib.check.mp.watch import BETWEEN, Watch
from course_lib.runtime.launch_child import write_json_atomic

POINT_TO_POINT = ("send", "recv", "isend", "irecv")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "gather", "scatter", "barrier", "monitored_barrier",
               "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list")
LIBRARY_MODULE = "course_lib.core.collectives"
LIBRARY = ("naive_all_reduce", "ring_all_reduce", "recursive_doubling_all_reduce",
           "ring_reduce_scatter", "ring_all_gather")
ALL_REDUCES = frozenset(("all_reduce", *(n for n in LIBRARY if n.endswith("all_reduce"))))
ROOTS = ("src", "dst", "group_src", "group_dst")  # the keywords that name a collective's root
NO_FUTURE = "Work::getFuture not implemented"  # Gloo, for a point-to-point handle
DRAIN_S = 3.0  # after a case, handles the learner never waited on get this long to finish


_real_path = functools.lru_cache(maxsize=512)(os.path.realpath)
OWN_FILES = (__file__, groups.__file__)  # the tracer's frames, not the learner's
CALLED = re.compile(r"([A-Za-z_][\w.]*)\s*\(")  # the first call on a line of code


@dataclass
class CaseLog:
    """What one rank did during one case."""

    bytes_sent: int = 0
    messages: int = 0  # sends of a non-empty tensor
    calls: set = field(default_factory=set)  # which of send, recv, isend, irecv, batch
    collectives: list = field(default_factory=list)  # names of collectives called
    library: list = field(default_factory=list)  # library functions called
    handed: list = field(default_factory=list)  # (call, dtype, numel) of each of those calls
    blocking: list = field(default_factory=list)  # collectives called without async_op
    handles: list = field(default_factory=list)  # every TracedWork handed out
    touched: list = field(default_factory=list)  # isends whose tensor changed before the wait
    forwarded: list = field(default_factory=list)  # sends of an irecv's tensor before its wait
    receiving: list = field(default_factory=list)  # the irecv handles that may still be open
    started: list = field(default_factory=list)  # every StartedCollective handed out

    def summary(self) -> dict:
        unwaited = [h.describe() for h in self.handles if not h.done]
        return {"bytes_sent": self.bytes_sent, "messages": self.messages,
                "calls": sorted(self.calls), "collectives": self.collectives,
                "library": self.library, "handed": self.handed, "blocking": self.blocking,
                "unwaited": unwaited, "touched": self.touched, "forwarded": self.forwarded}


class _Wrapped:
    """A stand-in for a torch.distributed function that compares equal to it (P2POp checks
    ``op in [isend, irecv]``). ``guard(original, args, kwargs)`` runs before the handler, also
    before one a case puts in its place (8.3 routes dist.all_reduce through its own)."""

    def __init__(self, original, handler, guard=None):
        functools.update_wrapper(self, original)
        self.original, self.handler, self.guard = original, handler, guard

    def __call__(self, *args, **kwargs):
        if self.guard is not None:
            self.guard(self.original, args, kwargs)
        return self.handler(self.original, *args, **kwargs)

    def __eq__(self, other):
        return other is self or other is self.original

    def __hash__(self):
        return hash(self.original)


def _overlap(a, b) -> bool:
    """Whether two tensors share memory: the same storage, overlapping element ranges."""
    if not isinstance(a, torch.Tensor) or a.untyped_storage().data_ptr() != \
            b.untyped_storage().data_ptr():
        return False
    ends = [t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(),
                                                                 strict=True)) + 1 for t in (a, b)]
    return a.numel() > 0 and b.numel() > 0 and a.storage_offset() < ends[1] and \
        b.storage_offset() < ends[0]


def _original(op):
    return op.original if isinstance(op, _Wrapped) else op


class TracedWork:
    """An ``isend``/``irecv`` handle that records its waits; everything else is passed on."""

    def __init__(self, work, tracer: Tracer, kind: str, peer, line, tensor=None):
        self._work, self._tracer = work, tracer
        self.kind, self.peer, self.line, self.done = kind, peer, line, False
        self.tensor = tensor  # (None in the course's own code) and what an isend's held (not
        self.sent = None if tensor is None or kind != "isend" else tensor.detach().clone()
        # its version counter: a view's is its base's, and a chunk written beside it is no race)

    def _finished(self) -> None:
        """The message is done with its tensor: an isend's, changed meanwhile, is noted."""
        if not self.done and self.sent is not None and not torch.equal(self.tensor, self.sent):
            self._tracer.log.touched.append(self.describe())
        self.done = True

    def wait(self, *args, **kwargs):
        self._tracer.status(op="wait", kind=self.kind, peer=self.peer,
                            line=self._tracer.learner_line(), open=self._tracer.open_handles(self))
        result = self._work.wait(*args, **kwargs)  # a timeout leaves the status as it is
        self._tracer.status(op=None)
        self._finished()
        return result

    def is_completed(self):
        finished = self._work.is_completed()
        if finished:
            self._finished()
        return finished

    def get_future(self):
        try:
            future = self._work.get_future()
        except RuntimeError as error:  # Gloo's isend and irecv have no future
            if NO_FUTURE in str(error):
                error.args = (f"{NO_FUTURE}: Gloo's isend and irecv handles have no future; "
                              "wait on the handle itself (its .wait())",)
            raise
        self.done = True  # waited on through the future: not ours to follow
        return future

    def __getattr__(self, name):
        return getattr(self._work, name)

    def describe(self) -> dict:
        return {"kind": self.kind, "peer": self.peer, "line": self.line}


class StartedCollective(TracedWork):
    """The handle of a collective started with ``async_op=True`` (``kind``: its name): it
    records whether it was waited on, and a wait says in the status which collective waits."""

    def wait(self, *args, **kwargs):
        self._tracer.status(op=self.kind, line=self._tracer.learner_line())  # it may block
        result = self._work.wait(*args, **kwargs)  # a timeout leaves the status as it is
        self._tracer.status(op=None)
        self.done = True
        return result


class Tracer(GroupChecks):
    """Install once per rank; ``watching`` around each call of the learner's function."""

    def __init__(self, run_dir: str, rank: int, learner_file: str):
        self.rank, self.learner_file = rank, _real_path(learner_file)
        self.status_path = os.path.join(run_dir, f"status{rank}.json")
        self.where_path = os.path.join(run_dir, f"where{rank}.json")
        self.log: CaseLog | None = None  # the case being watched, or None
        self.case, self.members, self.last = "", None, {}
        self._published, self._publishing = None, threading.Lock()  # the status last written
        self.inside = None  # the library function running now, if any
        self.control = None  # the checker's own group of every rank (program.make_groups)
        self.report = None  # the result the program is writing (the watch ends it, stuck)
        self._signatures = {}

    def retarget(self, run_dir: str, learner_file: str, report: dict | None = None) -> None:
        """Trace another learner's file, into another run folder (a shared launch);
        ``report``: the result the program writes for it."""
        self.report = report
        self.learner_file = _real_path(learner_file)
        self.status_path = os.path.join(run_dir, f"status{self.rank}.json")
        self.where_path = os.path.join(run_dir, f"where{self.rank}.json")
        self.last = {}

    # ---- where the learner is ---------------------------------------------------------------

    def learner_frame(self, frame=None):
        """The innermost frame of the learner's file on this thread's stack, or None."""
        frame = frame or sys._getframe(1)
        while frame is not None and _real_path(frame.f_code.co_filename) != self.learner_file:
            frame = frame.f_back
        return frame

    def learner_line(self):
        frame = self.learner_frame()
        return None if frame is None else frame.f_lineno

    def called_by_learner(self) -> bool:
        """Whether the learner's own line called the torch.distributed function being traced
        (not the course's code, on the learner's behalf)."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in OWN_FILES:
            frame = frame.f_back  # the tracer's own frames
        return frame is not None and _real_path(frame.f_code.co_filename) == self.learner_file

    def learner_call(self, default: str) -> str:
        """The function the learner's current line calls ("reduce_scatter_bucket",
        "dist.all_reduce"), read from the line; ``default`` when none is found."""
        line = self.learner_line()
        source = linecache.getline(self.learner_file, line).strip() if line else ""
        try:  # the first call by a name (dist.all_reduce(...).get_future(): dist.all_reduce)
            calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                     and not any(isinstance(m, ast.Call) for m in ast.walk(n.func))]
            first = min(calls, key=lambda n: n.col_offset, default=None)
            return ast.unparse(first.func) if first else default
        except SyntaxError:  # a line of a longer statement
            found = CALLED.search(source)
            return found.group(1) if found else default

    def barrier(self) -> None:
        """Wait for every rank, in a group the learner's code never sees (the checker's barrier
        cannot meet one the learner's code left waiting). The status says so, and keeps the
        case this rank finished last and how often it called each collective in it (a peer
        may wait in one of them)."""
        for op in (BETWEEN, None):
            self._note({**self.last, "rank": self.rank, "time": time.time(), "op": op,
                        "line": None})
            if op:
                dist.barrier(group=self.control)

    def open_handles(self, waited=None) -> list[dict]:
        """The isend/irecv handles of this case not waited on yet (but ``waited``)."""
        handles = self.log.handles if self.log is not None else []
        return [h.describe() for h in handles if not h.done and h is not waited]

    def status(self, **fields) -> None:
        """Record what this rank does now (op None: running its own code), with how often it
        called each collective in this case (a rank that called one less often than its
        peers leaves them waiting in it)."""
        if self.log is None:
            return
        calls = dict(collections.Counter(self.log.collectives))
        inside = {"inside": self.inside} if self.inside and fields.get("op") else {}
        self._note({"rank": self.rank, "case": self.case, "time": time.time(),
                    "collectives": calls, **inside, **fields})  # inside: the learner's call

    def _note(self, status: dict) -> None:
        """A status that waits (an op) is written at once: Gloo may abort the process inside
        that call, and the verdict reads where it was. Back in its own code (op None), the
        rank leaves the writing to the watch, every ``WATCH_S``: a file for each end of a
        call cost a tenth of a checker's CPU, and the watch calls a deadlock only when no
        status has changed for ``STUCK_S``."""
        self.last = status
        if status.get("op"):
            self.publish_status()

    def publish_status(self) -> None:
        """Write the status to ``status{R}.json`` if it changed since the last write (the
        program does with every result it saves, the watch every ``WATCH_S``)."""
        with self._publishing:  # the watch's thread and the main one: the newest written last
            last = self.last
            if last is not self._published:
                write_json_atomic(self.status_path, last)
                self._published = last

    # ---- installing the wrappers ------------------------------------------------------------

    def install(self, world_size: int | None = None) -> None:
        for name in POINT_TO_POINT:
            setattr(dist, name, _Wrapped(getattr(dist, name), self._point_to_point(name)))
        dist.batch_isend_irecv = _Wrapped(dist.batch_isend_irecv, self._batch)
        for name in COLLECTIVES:
            if hasattr(dist, name):
                setattr(dist, name, _Wrapped(getattr(dist, name), self._noted("collectives"),
                                             guard=self._check_group))
        library = importlib.import_module(LIBRARY_MODULE)
        for name in LIBRARY:
            setattr(library, name, _Wrapped(getattr(library, name), self._noted("library")))
        Watch(self, world_size or dist.get_world_size()).start()  # where, and deadlocks

    def _noted(self, kind: str):
        def handler(original, *args, **kwargs):
            if self.log is None:
                return original(*args, **kwargs)
            getattr(self.log, kind).append(original.__name__)
            self._note_tensor(original.__name__, args, kwargs)
            if kind != "collectives":
                outer, self.inside = self.inside, self.inside or original.__name__  # the one
                try:  # the learner's line calls (ring_all_reduce, not its reduce-scatter);
                    return original(*args, **kwargs)  # its peers are not named in that line
                finally:
                    self.inside = outer
            try:  # the guard has checked the group already (_check_group)
                bound = self._bound(original, args, kwargs)
            except TypeError:
                bound = {}  # torch reports a wrong call itself
            else:
                if not bound.get("async_op"):
                    self.log.blocking.append(original.__name__)
            started, line = bool(bound.get("async_op")), self.learner_line()
            roots = [f"{w}={bound[w]}" for w in ROOTS if bound.get(w) is not None]
            self.status(op=original.__name__, line=line,  # it may wait: say so, and its root
                        **({"root": roots[0]} if roots else {}))
            result = original(*args, **kwargs)  # a timeout leaves the status as it is
            self.status(op=None)
            if started and result is not None:  # a handle: remember whether it is waited on
                result = StartedCollective(result, self, original.__name__, None, line)
                self.log.started.append(result)
            return result

        return handler

    def _note_tensor(self, name: str, args, kwargs) -> None:
        tensor = args[0] if args else kwargs.get("tensor")
        if isinstance(tensor, torch.Tensor):
            self.log.handed.append((name, str(tensor.dtype).removeprefix("torch."),
                                    tensor.numel()))

    def _bound(self, original, args, kwargs) -> dict:
        name = original.__name__
        if name not in self._signatures:
            self._signatures[name] = inspect.signature(original)
        return self._signatures[name].bind(*args, **kwargs).arguments

    def _count(self, name: str, tensor) -> None:
        self.log.calls.add(name)
        if "send" in name and tensor is not None and tensor.numel() > 0:
            self.log.bytes_sent += tensor.numel() * tensor.element_size()
            self.log.messages += 1
            if not self.inside:  # the learner's own send (the course's rings are right)
                self._sent_while_receiving(tensor)

    def _sent_while_receiving(self, tensor) -> None:
        """Note a send of memory that an irecv not yet waited on may still be writing."""
        self.log.receiving = [h for h in self.log.receiving if not h.done]  # still open
        early = next((h for h in self.log.receiving if _overlap(h.tensor, tensor)), None)
        if early is not None:
            self.log.forwarded.append({"line": self.learner_line(), "peer": early.peer,
                                       "recv_line": early.line})

    def _point_to_point(self, name: str):
        def handler(original, *args, **kwargs):
            if self.log is None:
                return original(*args, **kwargs)
            tensor, peer, word = self._peer(name, original, args, kwargs)
            self._check_peer(name, peer, word)
            self._count(name, tensor)
            line = self.learner_line()
            if name in ("isend", "irecv"):
                work = original(*args, **kwargs)
                return None if work is None else self._handle(work, name, peer, line, tensor)
            self.status(op=name, peer=peer, line=line, open=self.open_handles())  # say first
            result = original(*args, **kwargs)  # a timeout leaves the status as it is
            self.status(op=None)
            return result

        return handler

    def _batch(self, original, ops, *args, **kwargs):
        if self.log is None:
            return original(ops, *args, **kwargs)
        line, kinds = self.learner_line(), []
        for op in ops:
            op.op = _original(op.op)  # torch tells isend from irecv by identity
            name = "isend" if op.op is _original(dist.isend) else "irecv"
            global_peer = op.group != dist.group.WORLD  # a P2POp keeps the peer's global rank
            if not global_peer and self._in_a_smaller_group() and (
                    op.peer not in self.members or op.peer == self.rank):
                raise self._without_group(f"{name} (a P2POp)", f"peer {op.peer}",
                                          "a P2POp's peer")
            self._check_peer(name, op.peer, "peer" if global_peer else None)
            self._count(name, op.tensor)
            kinds.append((name, op.peer))
        self.log.calls.add("batch")
        works = original(ops, *args, **kwargs)
        if len(works) != len(kinds):  # coalesced into one handle (NCCL)
            kinds = [("batch", None)] * len(works)
        tensors = [op.tensor for op in ops] if len(works) == len(ops) else [None] * len(works)
        return [self._handle(w, k, p, line, t)
                for w, (k, p), t in zip(works, kinds, tensors, strict=True)]

    def _handle(self, work, kind: str, peer, line, tensor=None) -> TracedWork:
        handle = TracedWork(work, self, kind, peer, line, None if self.inside else tensor)
        self.log.handles.append(handle)
        if kind == "irecv" and not self.inside:
            self.log.receiving.append(handle)
        return handle

    # ---- one case ---------------------------------------------------------------------------

    @contextmanager
    def watching(self, case: str, members):
        """Trace the learner's calls for one case; afterwards finish handles left open."""
        self.case, self.members, self.log = case, list(members), CaseLog()
        self.status(op=None)
        try:
            yield self.log
        finally:
            log, self.log = self.log, None
            self._drain(log)

    def _drain(self, log: CaseLog) -> None:
        """Let handles the learner never waited on finish, so they cannot mix into the next
        case; raise TimeoutError when one cannot."""
        for handle in log.handles:
            if handle.done:
                continue
            try:
                handle._work.wait(datetime.timedelta(seconds=DRAIN_S))
            except RuntimeError:
                raise TimeoutError(f"the {handle.kind} to/from rank {handle.peer} that rank "
                                   f"{self.rank} never waited on did not complete") from None
