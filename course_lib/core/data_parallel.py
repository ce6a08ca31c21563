"""Data parallelism by hand: same weights everywhere, gradients averaged over ranks
(notebooks 07 and 08).

    from course_lib.core.data_parallel import GradSync, broadcast_parameters
    broadcast_parameters(model, group)                  # every rank starts from rank 0's weights
    gs = GradSync(model, group, strategy="overlap", bucket_mb=25.0)
    for k in range(accum_steps):
        loss = loss_fn(model(x[k]), y[k]) / accum_steps  # k scaled losses sum to the mean
        gs.backward(loss, sync=(k == accum_steps - 1))   # only the last micro-step talks
    gs.finish()                                          # every .grad: the mean over ranks
    optimizer.step()                                     # same gradients -> same weights

Each rank's loss is the mean over its own shard of the global batch; the mean of those N means
is the mean over the whole batch (equal shards), so the gradients, summed over ranks and
divided by N (as torch DDP does), equal the single-process gradient of the whole batch.

Strategies (``STRATEGIES``), from slowest to fastest:
- ``naive``, ``ring``: after backward, one hand-written all-reduce per parameter
  (``course_lib.core.collectives``; notebook 06); ``allreduce``: the same with
  ``torch.distributed.all_reduce``.
- ``bucketed``: gradients copied into flat buckets of about ``bucket_mb`` MB (parameters in
  reverse order of registration, as backward makes them; ``course_lib.core.buckets``), one
  all-reduce per bucket after backward.
- ``overlap``: the same buckets, each launched from gradient hooks
  (``Tensor.register_post_accumulate_grad_hook``) as soon as all its gradients exist, so that
  communication runs while backward goes on; ``finish()`` waits for them.

Buckets are all-reduced with ``torch.distributed.all_reduce(async_op=True)`` (``comm="torch"``,
the default and the faster one), or with our ``ring_all_reduce`` on one background thread
(``comm="ring"``). Buckets are launched strictly in order, so every rank issues the same
collectives in the same order. ``finish()`` copies the means from the buckets into ``.grad``;
with ``gradient_as_bucket_view=True`` (as torch DDP allows) each ``.grad`` becomes its slot in
the bucket instead: one copy less, yet on CPU it measured slower (backward took longer; the
memory allocator's reuse of the freed gradients is the likely cause), so it is off by default.

A parameter that needs a gradient but got none on this rank (unused in its forward) counts as
a zero gradient: its bucket still completes and every rank joins every collective. After
``finish()`` its ``.grad`` holds the mean over ranks (zeros if no rank used it; torch DDP with
``find_unused_parameters=True`` would leave a parameter unused everywhere at ``None``). With
``overlap`` such a parameter holds its bucket back until ``finish()``; pass
``find_unused_parameters=True`` to find it before backward (a walk over the autograd graph,
as DDP does) so that its bucket can leave during backward. Parameters with
``requires_grad=False`` are left out.

``gs.timeline`` holds the events of the last synced step (see ``course_lib.lessons.timeline``); a
collective's end is when it completed (seen by a watcher thread on CPU; on CUDA the moment the
host saw it done, in ``finish()``), not when it was launched.
"""

from __future__ import annotations

import concurrent.futures
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core import buckets as bk
from course_lib.core.buckets import MB, Bucket, copy_grad_in, copy_grads_out, make_buckets
from course_lib.core.collectives import ByteCounter, naive_all_reduce, ring_all_reduce
from course_lib.lessons.timeline import CompletionWatcher, Timeline

STRATEGIES = ("naive", "ring", "allreduce", "bucketed", "overlap")
PER_PARAMETER = ("naive", "ring", "allreduce")  # one collective per parameter
COMMS = ("torch", "ring")  # what all-reduces a bucket


def broadcast_parameters(model: nn.Module, group: dist.ProcessGroup | None = None,
                         src: int = 0) -> None:
    """Give every rank the parameters and buffers of rank ``src`` (a global rank)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.detach(), src=src, group=group)  # overwritten in place


class GradSync:
    """Average gradients over the ranks of ``group`` with one of ``STRATEGIES``.

    After each synced step: ``timeline`` (its events), ``stats`` (collectives launched,
    bytes_reduced handed to them, bytes_sent counted by our collectives or None when torch's
    all_reduce did the work, buckets); ``totals`` adds up since construction; ``buckets``
    (``course_lib.core.buckets.Bucket``) shows how the parameters were packed.
    """

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None,
                 strategy: str = "ring", bucket_mb: float = 25.0, comm: str = "torch",
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; pick one of {STRATEGIES}")
        if comm not in COMMS:
            raise ValueError(f"unknown comm {comm!r}; pick one of {COMMS}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}; torch DDP uses 25")
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named_params:
            raise ValueError("the model has no parameter with requires_grad=True: "
                             "there is nothing to synchronise")
        self.model, self.group, self.strategy, self.comm = model, group, strategy, comm
        self.bucket_mb = bucket_mb
        self.find_unused_parameters = find_unused_parameters  # "overlap": look before backward
        self.gradient_as_bucket_view = gradient_as_bucket_view  # .grad = a view, not a copy
        self.world_size = dist.get_world_size(group)  # needs the process group made first
        self.buckets: list[Bucket] = []
        if strategy in ("bucketed", "overlap"):
            self.buckets = make_buckets(self.named_params, int(bucket_mb * MB))
        self._slot_of = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._hooks = []
        if strategy == "overlap":
            for _, p in self.named_params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        self._executor = None  # the background thread of comm="ring", made when first used
        self._no_sync_depth = 0  # > 0 inside `with gs.no_sync():`
        self._armed = False  # the hooks launch buckets during this backward
        self._pending = False  # a synced backward ran; finish() has not yet
        self._next_bucket = 0  # buckets launch in order: the next one to launch
        self._in_flight: list[tuple[Bucket, dict, object]] = []
        self._clock = Timeline()
        self._watcher = CompletionWatcher(self._clock)  # end times of async all-reduces
        self._counter = None
        self.stats: dict = {}
        self.totals = {"backward_calls": 0, "synced_steps": 0, "collectives": 0,
                       "bytes_reduced": 0}

    # ---- what a training loop calls -------------------------------------------------------

    def backward(self, loss: torch.Tensor, sync: bool = True) -> None:
        """``loss.backward()``; with ``sync`` (and outside ``no_sync()``) this micro-step's
        gradients are the ones ``finish()`` averages. Without it nothing is communicated."""
        if self._pending:
            raise RuntimeError("backward() after a synced backward: call gs.finish() first, or "
                               "pass sync=False to every micro-step but the last")
        self.totals["backward_calls"] += 1
        if not sync or self._no_sync_depth > 0:
            loss.backward()  # gradients only accumulate locally in .grad
            return
        self._begin_step()
        self._armed = self.strategy == "overlap"
        if self._armed and self.find_unused_parameters:
            self._mark_unused_ready(bk.parameters_in_graph(loss))
        try:
            loss.backward()
        finally:
            self._armed = False
        if self._device().type == "cuda":
            torch.cuda.current_stream().synchronize()  # backward's kernels are done now
        self._clock.add("backward", "compute", 0.0, self._clock.now())
        self._pending = True

    def finish(self) -> None:
        """Complete the sync: afterwards every ``.grad`` holds the mean over ranks."""
        if not self._pending:
            raise RuntimeError("finish() found no synced backward since the last finish(); "
                               "call gs.backward(loss, sync=True) on the last micro-step "
                               "(outside no_sync())")
        try:
            if self.strategy in PER_PARAMETER:
                self._sync_each_parameter()
            else:
                self._launch_remaining_buckets()  # all of them for "bucketed"
                self._wait_for_buckets()
        finally:
            self._pending = False
        self._end_step()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, ``backward()`` never communicates (torch DDP's name for the same idea)."""
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1

    @property
    def timeline(self) -> list[dict]:
        """Events of the last synced step, times in seconds from the start of its backward."""
        return self._clock.events

    def remove_hooks(self) -> None:
        """Unregister the gradient hooks (strategy "overlap") and stop the ring's thread."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._watcher.close()

    # ---- one step's bookkeeping ----------------------------------------------------------

    def _device(self) -> torch.device:
        return self.named_params[0][1].device

    def _begin_step(self) -> None:
        self._clock.restart()
        ours = self.strategy in ("naive", "ring") or (self.comm == "ring" and bool(self.buckets))
        self._counter = ByteCounter() if ours else None  # our collectives count their bytes
        self.stats = {"strategy": self.strategy, "collectives": 0, "bytes_reduced": 0}
        self._next_bucket = 0
        self._in_flight = []
        for bucket in self.buckets:
            bucket.reset()

    def _count(self, nbytes: int) -> None:
        self.stats["collectives"] += 1
        self.stats["bytes_reduced"] += nbytes
        self.totals["collectives"] += 1
        self.totals["bytes_reduced"] += nbytes

    def _end_step(self) -> None:
        self.totals["synced_steps"] += 1
        counted = self._counter is not None  # torch's all_reduce does not say what it sent
        self.stats["bytes_sent"] = self._counter.bytes_sent if counted else None
        self.stats["buckets"] = len(self.buckets)

    # ---- one collective per parameter ----------------------------------------------------

    def _sync_each_parameter(self) -> None:
        for name, p in reversed(self.named_params):  # backward order, like the buckets
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # unused here; another rank may have used it
            nbytes = p.grad.numel() * p.grad.element_size()
            event = self._clock.add(name, "comm", self._clock.now(), nbytes=nbytes)
            self._all_reduce_now(p.grad)  # the sum over ranks
            p.grad.div_(self.world_size)  # divided by N: the mean over ranks
            event["end_s"] = self._clock.now()
            self._count(nbytes)

    def _all_reduce_now(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over ranks in place, blocking until done."""
        if self.strategy == "allreduce":
            dist.all_reduce(tensor, group=self.group)
        elif self.strategy == "ring":
            ring_all_reduce(tensor, group=self.group, counter=self._counter)
        else:
            naive_all_reduce(tensor, group=self.group, counter=self._counter)
        if tensor.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # honest end time on a GPU

    # ---- buckets -------------------------------------------------------------------------

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        """Hook: ``param.grad`` is final for this backward; launch every bucket now ready."""
        if not self._armed:
            return
        bucket, i = self._slot_of[param]
        if bucket.index < self._next_bucket:
            raise RuntimeError(f"the gradient of {bucket.names[i]} came after its bucket was "
                               "sent; build GradSync with find_unused_parameters=False")
        copy_grad_in(bucket, i, self.world_size)
        if bucket.complete():
            self._launch_ready_buckets()

    def _mark_unused_ready(self, in_graph: set[int]) -> None:
        """Parameters outside this backward's graph get no hook call: copy them in now."""
        for param, (bucket, i) in self._slot_of.items():
            if id(param) not in in_graph:
                copy_grad_in(bucket, i, self.world_size)  # zeros, or what earlier steps left
        self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        """Launch, in order, every bucket whose gradients are all in."""
        while (self._next_bucket < len(self.buckets)
               and self.buckets[self._next_bucket].complete()):
            self._launch(self.buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch_remaining_buckets(self) -> None:
        """Fill and launch every bucket not launched yet (a missing gradient counts as 0)."""
        for bucket in self.buckets[self._next_bucket:]:
            for i in range(len(bucket.params)):
                copy_grad_in(bucket, i, self.world_size)  # skips gradients already in
            self._launch(bucket)
        self._next_bucket = len(self.buckets)

    def _launch(self, bucket: Bucket) -> None:
        """Start the bucket's all-reduce without waiting for it."""
        event = self._clock.add(f"bucket {bucket.index}", "comm", self._clock.now(),
                                nbytes=bucket.nbytes)
        if self.comm == "ring":
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, "ring-bucket")
            future = self._executor.submit(self._ring_in_background, bucket, event)
        else:
            future = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
            if bucket.buffer.device.type != "cuda":  # on a GPU, finish() sees the end
                self._watcher.watch(future, event)
        self._in_flight.append((bucket, event, future))
        self._count(bucket.nbytes)

    def _ring_in_background(self, bucket: Bucket, event: dict) -> None:
        event["start_s"] = self._clock.now()  # queued until now: the ring starts here
        ring_all_reduce(bucket.buffer, group=self.group, counter=self._counter)
        event["end_s"] = self._clock.now()

    def _wait_for_buckets(self) -> None:
        """Wait for every bucket in launch order, then write the means into ``.grad``."""
        for bucket, event, future in self._in_flight:
            if isinstance(future, concurrent.futures.Future):
                future.result()  # re-raises an error from the ring's thread
            else:
                future.wait()  # the Work of the async all-reduce; raises if it failed
            if bucket.buffer.device.type == "cuda":
                torch.cuda.current_stream().synchronize()  # the host sees it done only now
                event["end_s"] = self._clock.now()
            copy_grads_out(bucket, as_views=self.gradient_as_bucket_view)
        self._in_flight = []
        self._watcher.settle()  # every end time written before the next step restarts the clock
