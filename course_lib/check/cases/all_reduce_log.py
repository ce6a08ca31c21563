"""Every ``dist.all_reduce`` of one case of exercise 8.3 (``hooks``), on the rank side: when it
came (during backward or after, how many gradients were ready), which tensor it reduced, and
the learner's async handles. A handle holds the sum back until it is waited on (``HeldBack``:
the bucket keeps this rank's values till ``wait()``, as a real all-reduce may), so a bucket
read before its wait gives a wrong gradient every time, not only when the network is slow; and
a bucket written before its wait (divided, or filled for the next step) is seen at ``wait()``,
though the sum then lands over it.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import torch.distributed as dist

from course_lib.check.mp.tracer import Tracer


class HeldBack:
    """The learner's async handle: the sum lands in the bucket when the learner waits on it
    (or sees it completed), not before."""

    def __init__(self, work, private: torch.Tensor, bucket: torch.Tensor, line, log):
        self.work, self.private, self.bucket, self.line, self.log = work, private, bucket, \
            line, log
        self.sent = bucket.detach().clone()  # what the bucket held when the all-reduce started
        self.done = self.waited_in_backward = False

    def wait(self, *args, **kwargs):
        if not self.done:
            self.waited_in_backward = self.log.in_backward
            self.log.tracer.status(op="all_reduce", line=self.log.tracer.learner_line(),
                                   waiting=True)  # it may block: say so
            self.work.wait(*args, **kwargs)
            self.log.tracer.status(op=None)
            self._land()
        return True

    def is_completed(self):
        """Polling waits for nothing: a finished all-reduce lands, and is not a wait."""
        if not self.done and self.work.is_completed():
            self._land()
        return self.done

    def get_future(self):
        """A future that completes with the sum in the bucket."""
        self.done = True
        return self.work.get_future().then(lambda _: self._land(force=True))

    def _land(self, force: bool = False):
        if force or not self.done:
            if not torch.equal(self.bucket, self.sent):  # written while the sum was on its way
                self.log.written_in_flight.append(self.line)
            self.bucket.copy_(self.private)  # only now does the bucket hold the sum
            self.done = True
        return [self.bucket]

    def __getattr__(self, name):
        return getattr(self.work, name)


class AllReduceLog:
    """Every ``dist.all_reduce`` of one case: when it came, and the handles given out."""

    def __init__(self, tracer: Tracer, total_params: int):
        self.tracer, self.total = tracer, total_params
        self.in_backward, self.ready = False, 0  # set by the case and by its counting hooks
        self.order = []  # parameter indices, in the order their gradients were ready
        self.calls, self.handles, self._signature = [], [], None
        self.written_in_flight = []  # lines of the all-reduces whose bucket changed meanwhile

    def arrived(self, index: int) -> None:
        """A counting hook: parameter ``index``'s gradient is ready (before the learner's)."""
        self.ready += 1
        self.order.append(index)

    def handler(self, original, *args, **kwargs):
        self._signature = self._signature or inspect.signature(original)
        bound = self._signature.bind(*args, **kwargs).arguments
        tensor, is_async = bound.get("tensor"), bool(bound.get("async_op", False))
        line = self.tracer.learner_line()
        self.tracer.log.collectives.append("all_reduce")  # counted, as the tracer counts
        self.calls.append({"async": is_async, "in_backward": self.in_backward,
                           "ready": self.ready, "total": self.total, "line": line,
                           "numel": tensor.numel(), "tensor": tensor.data_ptr()})
        if not is_async:
            self.tracer.status(op="all_reduce", line=line)  # it blocks: say so
            result = original(*args, **kwargs)
            self.tracer.status(op=None)
            return result
        private = tensor.detach().clone()  # reduced in the background, copied in at wait()
        bound["tensor"] = private
        handle = HeldBack(original(**bound), private, tensor, line, self)
        self.handles.append(handle)
        return handle

    def drain(self) -> None:
        """Finish every all-reduce the learner left open, so none mixes into the next case."""
        for handle in self.handles:
            handle.work.wait()

    def summary(self) -> dict:
        return {"calls": self.calls,
                "unwaited": [h.line for h in self.handles if not h.done],
                "written_in_flight": self.written_in_flight,
                "waited_in_backward": [h.line for h in self.handles if h.waited_in_backward]}


@contextmanager
def recording(log: AllReduceLog):
    """Route ``dist.all_reduce`` (the tracer's stand-in, however the learner imported it)
    through ``log`` while the case runs."""
    stand_in = dist.all_reduce
    saved = stand_in.handler
    stand_in.handler = log.handler
    try:
        yield
    finally:
        stand_in.handler = saved
