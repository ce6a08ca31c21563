"""When compute and communication ran during one training step, and how much of it overlapped
(notebook 08). Not part of the teaching code: an optional recorder around it (the counting
alone, without clocks or a thread, is ``course_lib.runtime.counting.CountedAllReduce``).

    recorder = CommRecorder(dist.all_reduce)          # counts and times every all-reduce
    model = OverlapDataParallel(module, group, all_reduce=recorder)
    recorder.start_step()
    with recorder.compute("backward"):
        loss.backward()
    model.finish_gradient_sync()
    recorder.settle()                                 # every end time is in
    recorder.events, recorder.calls, recorder.bytes

A step is a list of events:

    {"name": "backward", "kind": "compute", "start_s": 0.0, "end_s": 0.012, "bytes": 0}
    {"name": "bucket 0", "kind": "comm", "start_s": 0.004, "end_s": 0.007, "bytes": 1048576}

Times are seconds from the start of backward. ``overlap_summary`` says how much communication
was hidden under backward; ``plot_timeline`` draws the step as two lanes of bars.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Sequence

from course_lib.runtime.counting import CountedAllReduce

if TYPE_CHECKING:  # only for the annotations
    import torch
    import torch.distributed as dist


class Timeline:
    """A clock that starts with backward, and the events measured against it."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.events: list[dict] = []

    def restart(self) -> None:
        self.origin = time.perf_counter()
        self.events = []

    def now(self) -> float:
        """Seconds since the last ``restart``."""
        return time.perf_counter() - self.origin

    def add(self, name: str, kind: str, start_s: float, end_s: float | None = None,
            nbytes: int = 0) -> dict:
        """Add an event; an open one (``end_s=None``) is closed later by setting ``end_s``."""
        event = {"name": name, "kind": kind, "start_s": start_s, "end_s": end_s,
                 "bytes": int(nbytes)}
        self.events.append(event)
        return event


class CompletionWatcher:
    """A thread that waits for each asynchronous collective and writes down when it ended.

    ``work.wait()`` lets go of Python's lock (the GIL) while it waits, so the watcher costs the
    training loop nothing, and the communication threads never wait for Python: a Python
    callback on the work's future would run on the thread that does the communication and
    stall the next collective until the GIL is free. An end time is late by at most the time
    the watcher waits for the GIL once the work is done.
    """

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.todo: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None

    def watch(self, work, event: dict, on_gpu: bool = False) -> None:
        """Set ``event["end_s"]`` when ``work`` (from ``async_op=True``) completes. On a GPU
        ``wait()`` returns before the collective ran (it only orders the streams): the
        watcher asks ``is_completed()`` until the GPU is done."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="comm-watcher", daemon=True)
            self.thread.start()
        self.todo.put((work, event, on_gpu))

    def settle(self) -> None:
        """Return once every watched work has its end time."""
        self.todo.join()

    def close(self) -> None:
        if self.thread is not None:
            self.todo.put(None)
            self.thread.join()
            self.thread = None

    def _run(self) -> None:
        while (item := self.todo.get()) is not None:
            work, event, on_gpu = item
            try:
                work.wait()
                while on_gpu and not work.is_completed():
                    time.sleep(50e-6)  # NCCL: the kernel's end, not its place in the queue
            except Exception:  # the training loop's own wait() raises it
                pass
            event["end_s"] = self.timeline.now()
            self.todo.task_done()
        self.todo.task_done()


class CommRecorder(CountedAllReduce):
    """An all-reduce function that counts (``calls``, ``bytes``) and times each call: use it
    wherever the wrappers take ``all_reduce=``. Synchronous calls end when they return;
    asynchronous ones (``async_op=True``) when a watcher thread sees their work complete."""

    def __init__(self, all_reduce) -> None:
        super().__init__(all_reduce)
        self.clock = Timeline()
        self.watcher = CompletionWatcher(self.clock)

    def __call__(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                 async_op: bool = False):
        nbytes = self.count(tensor)
        number = sum(e["kind"] == "comm" for e in self.clock.events)  # 0 for the step's first
        event = self.clock.add(f"all-reduce {number}", "comm", self.clock.now(), nbytes=nbytes)
        if async_op:
            work = self.inner(tensor, group=group, async_op=True)
            self.watcher.watch(work, event, on_gpu=tensor.device.type == "cuda")
            return work
        self.inner(tensor, group=group)
        if tensor.device.type == "cuda":
            torch_sync()
        event["end_s"] = self.clock.now()
        return None

    def start_step(self) -> None:
        """Start a new timeline: time 0 is now."""
        self.settle()
        self.clock.restart()

    def compute(self, name: str):
        """``with recorder.compute("backward"):`` records the block as a compute event."""
        return _ComputeBlock(self.clock, name)

    def settle(self) -> None:
        self.watcher.settle()

    @property
    def events(self) -> list[dict]:
        return self.clock.events

    def close(self) -> None:
        self.watcher.close()


class _ComputeBlock:
    def __init__(self, clock: Timeline, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self):
        self.event = self.clock.add(self.name, "compute", self.clock.now())
        return self.event

    def __exit__(self, *exc) -> None:
        torch_sync(compute_only=True)  # not the collectives still running beside it
        self.event["end_s"] = self.clock.now()


def torch_sync(compute_only: bool = False) -> None:
    """On a GPU, wait for the queued kernels, so that an end time is the real one:
    ``compute_only``, those of the current stream (not NCCL's), else the whole device's."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        if compute_only:
            torch.cuda.current_stream().synchronize()
        else:
            torch.cuda.synchronize()


def merge_intervals(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted intervals that do not touch each other."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def overlap_summary(events: Sequence[dict]) -> dict:
    """How long backward and communication took, and the share of communication hidden.

    comm_s: time during which at least one collective was in flight (overlapping collectives
    count once). hidden_s: the part of it that fell inside backward. exposed_s: the rest,
    which the step had to wait for. hidden_fraction = hidden_s / comm_s (0 when no comm).
    """
    compute = [(e["start_s"], e["end_s"]) for e in events if e["kind"] == "compute"]
    comm = merge_intervals([(e["start_s"], e["end_s"]) for e in events if e["kind"] == "comm"])
    backward = [(s, e) for s, e in compute]  # the compute lane: backward (and any copies)
    hidden = 0.0
    for c_start, c_end in comm:
        for b_start, b_end in merge_intervals(backward):
            hidden += max(0.0, min(c_end, b_end) - max(c_start, b_start))  # shared part
    comm_s = _length(comm)
    ends = [e["end_s"] for e in events]
    return {"backward_s": _length(merge_intervals(backward)), "comm_s": comm_s,
            "hidden_s": hidden, "exposed_s": comm_s - hidden,
            "hidden_fraction": hidden / comm_s if comm_s > 0 else 0.0,
            "step_s": max(ends) if ends else 0.0,
            "comm_bytes": sum(e["bytes"] for e in events if e["kind"] == "comm")}


def plot_timeline(events: Sequence[dict], ax=None, title: str | None = None):
    """Draw compute and communication as bars on two lanes; returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots()
    lanes = {"compute": (1, "tab:blue"), "comm": (0, "tab:orange")}
    for event in events:
        lane, colour = lanes[event["kind"]]
        start_ms = 1000 * event["start_s"]
        width_ms = 1000 * (event["end_s"] - event["start_s"])
        ax.broken_barh([(start_ms, width_ms)], (lane - 0.35, 0.7), facecolors=colour,
                       edgecolor="black", linewidth=0.5, alpha=0.8)
    ax.set_yticks([0, 1], ["communication", "compute"])
    ax.set_xlabel("time since backward started (ms)")
    ax.set_ylim(-0.6, 1.6)
    if title:
        ax.set_title(title)
    return ax
