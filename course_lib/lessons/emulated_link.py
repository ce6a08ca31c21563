"""A network link whose transfers do not use this machine's CPU, emulated (notebook 08).

On a CPU, Gloo moves the bytes with the same cores that run backward, so overlapping the two
cannot win on an idle machine. A NIC or NVLink moves them with its own hardware. This link
keeps the real all-reduce (so every number stays right) but holds its completion back until the
time an alpha-beta link would need for it:

    link = EmulatedLink(alpha_s=500e-6, bytes_per_s=62.5e6, group=group)  # notebook 08's
    model = OverlapDataParallel(module, group, 1.0, all_reduce=link.all_reduce)  # our wrappers
    ddp.register_comm_hook(None, link.ddp_hook)                                 # torch DDP

The link carries one message at a time: an all-reduce of n bytes launched at time t finishes at
max(t, the previous message's finish) + alpha + n / bandwidth, or when the real all-reduce
finishes, if that is later. Waiting for it sleeps until then: the CPU stays free for backward,
as it does while a NIC sends. (On 2 ranks a ring all-reduce sends n bytes per rank, so
n / bandwidth is also the ring's transfer time on such a link.)
"""

from __future__ import annotations

import queue
import statistics
import threading
import time

import torch
import torch.distributed as dist

from course_lib.lessons.timeline import overlap_summary


def sleep_until(deadline_s: float, clock=time.perf_counter) -> None:
    """Sleep (no CPU) until ``clock()`` reaches ``deadline_s``."""
    delay = deadline_s - clock()
    if delay > 0:
        time.sleep(delay)


class LinkWork:
    """The handle of an all-reduce on the link: ``wait()`` returns at its modelled finish."""

    def __init__(self, work, finish_s: float, clock=time.perf_counter):
        self.work, self.finish_s, self.clock = work, finish_s, clock

    def wait(self, *args, **kwargs) -> bool:
        self.work.wait(*args, **kwargs)  # the real all-reduce: the numbers are in
        sleep_until(self.finish_s, self.clock)  # the link's bytes arrive only now
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed() and self.clock() >= self.finish_s


class EmulatedLink:
    """An alpha-beta link that carries one message at a time (see the module's docstring).

    alpha_s: the start-up cost of one message (s). bytes_per_s: the bandwidth, 1 / beta.
    group: the process group of ``ddp_hook``. inner: the real all-reduce, run for the numbers.
    """

    def __init__(self, alpha_s: float, bytes_per_s: float, group: dist.ProcessGroup | None = None,
                 inner=dist.all_reduce, clock=time.perf_counter):
        if alpha_s < 0 or bytes_per_s <= 0:
            raise ValueError(f"the link needs alpha >= 0 and a positive bandwidth, got "
                             f"alpha_s={alpha_s}, bytes_per_s={bytes_per_s}")
        self.alpha_s, self.bytes_per_s = alpha_s, bytes_per_s
        self.group, self.inner, self.clock = group, inner, clock
        self.free_at_s = float("-inf")  # when the link finishes the last message it was given
        self.lock = threading.Lock()  # DDP may launch from autograd's thread
        self.timer: _Timer | None = None

    def message_s(self, nbytes: int) -> float:
        """alpha + beta x n: the time one message of ``nbytes`` takes on the link alone."""
        return self.alpha_s + nbytes / self.bytes_per_s

    def schedule(self, nbytes: int, now_s: float | None = None) -> float:
        """Put a message of ``nbytes`` on the link at ``now_s``; returns when it finishes."""
        now_s = self.clock() if now_s is None else now_s
        with self.lock:
            start = max(now_s, self.free_at_s)  # one message at a time: queue behind the last
            self.free_at_s = start + self.message_s(nbytes)
            return self.free_at_s

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                   async_op: bool = False):
        """``dist.all_reduce`` on the link: pass it as the wrappers' ``all_reduce=``."""
        work = self.inner(tensor, group=group, async_op=True)
        handle = LinkWork(work, self.schedule(tensor.numel() * tensor.element_size()),
                          self.clock)
        if async_op:
            return handle
        handle.wait()
        return None

    def ddp_hook(self, state, bucket) -> torch.futures.Future:
        """A torch DDP communication hook: the mean of the bucket over the ranks of
        ``self.group``, in a future completed at the link's finish (by a timer thread)."""
        tensor = bucket.buffer().div_(dist.get_world_size(self.group))  # sum of g / N: mean
        work = self.inner(tensor, group=self.group, async_op=True)
        finish_s = self.schedule(tensor.numel() * tensor.element_size())
        future: torch.futures.Future = torch.futures.Future()
        if self.timer is None:
            self.timer = _Timer(self.clock)
        self.timer.complete(LinkWork(work, finish_s, self.clock), future, tensor)
        return future

    def close(self) -> None:
        """End the timer thread (after the last step)."""
        if self.timer is not None:
            self.timer.close()
            self.timer = None


class _Timer:
    """A thread that completes each future at its message's finish, in launch order (the
    link is first in, first out, so no later message finishes before an earlier one)."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.todo: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="link-timer", daemon=True)
        self.thread.start()

    def complete(self, work: LinkWork, future: torch.futures.Future, value) -> None:
        self.todo.put((work, future, value))

    def close(self) -> None:
        self.todo.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (item := self.todo.get()) is not None:
            work, future, value = item
            try:
                work.wait()  # sleeps: the GIL and the CPU stay free for backward
            except Exception as error:  # the rank waiting on the future gets it
                future.set_exception(error)
                continue
            future.set_result(value)


def quartiles(times_s) -> tuple[float, float, float]:
    """First quartile, median and third quartile of a configuration's step times."""
    q1, median, q3 = statistics.quantiles(times_s, n=4)
    return q1, median, q3


def overlap_verdict(rows: dict) -> dict:
    """What notebook 08 checks on the link, from the rows of a ``bucket_sweep`` run with
    ``--compute-only`` (label -> row), in seconds: the quartiles and the fastest step of buckets
    after backward and of overlap; compute alone, its backward, and the link alone (alpha + beta
    n over a step's buckets). Overlap can hide the link only behind backward (the link is idle
    during forward and the optimizer step), so the best it can do is the rest of compute plus
    the larger of backward and the link; buckets after backward pay compute and the link one
    after the other.

    A shared machine's load only ever adds time to a step, so the fastest step is the figure
    that load disturbs least (``timeit`` reports it for the same reason): the comparisons that
    must hold on a busy machine use it, beside the medians.
    """
    bucketed = quartiles(rows["bucketed"]["step_times_s"])
    overlap = quartiles(rows["overlap"]["step_times_s"])
    fastest = {label: min(rows[label]["step_times_s"]) for label in rows}
    alone = rows["compute only"]
    compute = statistics.median(alone["step_times_s"])
    backward = statistics.median(alone["backward_times_s"])
    link = rows["overlap"]["link_s"]
    best = compute - backward + max(backward, link)
    return {"bucketed": bucketed, "overlap": overlap, "fastest": fastest, "compute_s": compute,
            "backward_s": backward, "link_s": link, "best_overlap_s": best,
            "over_best": fastest["overlap"] / best,
            "bucketed_over_sum": bucketed[1] / (compute + link)}


def overlap_ahead(rows: dict) -> bool:
    """Whether a run shows what notebook 08 checks on the link: overlap ahead of buckets after
    backward in its fastest step and its median, within 1.5 x the best it can do, buckets after
    backward at least 0.8 x compute plus the link, the communication left after backward, and
    the fastest steps of one all-reduce per parameter and of torch DDP. A run that other work
    on a shared machine starved (compute alone slowed several-fold) can miss it; the notebook
    measures once more."""
    v = overlap_verdict(rows)
    fastest = v["fastest"]
    after = {label: overlap_summary(rows[label]["timeline"])["exposed_s"]
             for label in ("bucketed", "overlap")}  # communication left after backward
    return (fastest["overlap"] < fastest["bucketed"] and v["overlap"][1] < v["bucketed"][1]
            and v["over_best"] <= 1.5 and v["bucketed_over_sum"] >= 0.8
            and after["bucketed"] >= 0.99 * v["link_s"] and after["overlap"] < after["bucketed"]
            and fastest["allreduce"] > fastest["bucketed"] > fastest["ddp"])
