"""Data parallelism by hand, step 3: buckets sent while backward still runs (notebook 08).

Backward makes the last layer's gradients first. As soon as every gradient of a bucket is
final, its all-reduce can start, while backward computes the earlier layers' gradients: the
communication hides behind the computation. A hook on each parameter
(``Tensor.register_post_accumulate_grad_hook``: called when ``.grad`` is final for this
backward) copies the gradient into its bucket and launches every bucket that is complete, with
``dist.all_reduce(..., async_op=True)``, which returns at once with a handle;
``finish_gradient_sync()`` waits for them. Buckets launch strictly in order, so every rank
issues the same collectives in the same order, whatever order its hooks fire in.

A gradient that comes after its bucket was sent cannot be in the sum: as DDP does, a parameter
whose gradient arrives twice in one sync (a second backward through the same graph, or one that
``find_unused_parameters`` counted as unused) is refused, by name. A synced forward that comes
before ``finish_gradient_sync()`` first finishes the sync the last backward started, as DDP's
backward ends with it.

    model = OverlapDataParallel(module, process_group=group, bucket_cap_mb=25)  # as the others
    ...; loss.backward(); model.finish_gradient_sync(); optimizer.step()
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from course_lib.core.buckets import BucketedDataParallel, copy_out
from course_lib.core.data_parallel import mark_unused
from course_lib.core.outputs import tensors_in


class OverlapDataParallel(BucketedDataParallel):
    """Average gradients over the ranks: each bucket is all-reduced from a gradient hook.

    ``all_reduce``: ``dist.all_reduce``, the default of all three wrappers, as in DDP. Here it
    must take ``async_op=True`` and return a handle to wait on: the course's ring does not."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float | None = 25.0, all_reduce=dist.all_reduce,
                 find_unused_parameters: bool = False):
        super().__init__(module, process_group, bucket_cap_mb, all_reduce,
                         find_unused_parameters)
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        self.launched = []  # (bucket, handle of its all-reduce), in launch order
        self.ready = set()  # ids of the parameters whose gradient is in its bucket this step
        self.counted_unused = 0  # of them, those forward counted in (find_unused_parameters)
        for param in self.params:
            param.register_post_accumulate_grad_hook(self.gradient_ready)  # NEW

    def forward(self, *inputs, **kwargs):
        if self.sync_pending and len(self.ready) > self.counted_unused:  # a backward began
            self.finish_gradient_sync()  # its sync: finish it first, as DDP's backward does
        output = super().forward(*inputs, **kwargs)  # decides whether this backward syncs
        if self.sync_pending:
            self.launched, self.ready = [], set()
            for bucket in self.buckets:
                bucket.waiting = len(bucket.params)  # a new step: no gradient in yet
            if self.find_unused_parameters:  # their hooks will not fire: count them in now
                for param in params_outside(output, self.params):
                    self.gradient_ready(param)
            self.counted_unused = len(self.ready)
        return output

    def gradient_ready(self, param: nn.Parameter) -> None:
        """Hook: ``param.grad`` is final. Copy it in; launch every bucket that is complete."""
        if not self.sync_pending:
            return  # inside no_sync(): gradients only accumulate in .grad
        if id(param) in self.ready:  # its bucket may be on its way already
            raise RuntimeError(marked_twice(self.names[id(param)], self.find_unused_parameters))
        self.ready.add(id(param))
        bucket = self.bucket_of[param]
        if param.grad is None:
            bucket.slot(param).zero_()  # unused here; other ranks may have used it
        else:
            bucket.slot(param).copy_(param.grad)
        bucket.waiting -= 1
        while len(self.launched) < len(self.buckets):  # launch in order, never skip one
            nxt = self.buckets[len(self.launched)]
            if nxt.waiting > 0:
                break
            handle = self.all_reduce(nxt.buffer, group=self.process_group, async_op=True)
            self.launched.append((nxt, handle))  # no wait: backward goes on meanwhile

    def finish_gradient_sync(self) -> None:
        """Launch what backward did not (parameters without a gradient), wait for every
        bucket, then copy the means into ``.grad``."""
        for param in self.params:
            if id(param) not in self.ready:
                self.gradient_ready(param)  # its hook did not fire in this backward
        self.take_pending_sync()  # raises if no forward outside no_sync() came first
        no_rank_used = []  # their .grad stays None, as in DDP
        if self.find_unused_parameters:
            unused = mark_unused(self.params, self.process_group)
            no_rank_used = [p for p, u in zip(self.params, unused, strict=True) if u]
        for bucket, handle in self.launched:
            handle.wait()  # the sum over the ranks is in the bucket now
            bucket.buffer.div_(self.world_size)  # the mean
            copy_out(bucket, skip=no_rank_used)
        self.launched, self.ready = [], set()  # all taken


def marked_twice(name: str, find_unused_parameters: bool) -> str:
    """DDP's error for a gradient that arrives twice in one sync, with our causes."""
    start = (f"Expected to mark a variable ready only once: parameter {name!r} got a second "
             "gradient before finish_gradient_sync(), after its bucket could have been sent. ")
    if find_unused_parameters:
        return start + ("find_unused_parameters=True found no path to it from forward's "
                        "output and counted it as unused, but the loss used it anyway: "
                        "outside forward (model.module..., a regulariser), or through an "
                        "output the search cannot look into. Use it inside forward and return "
                        "it in a tensor, list, tuple, dict or dataclass; if every parameter "
                        "takes part in every backward, pass find_unused_parameters=False, as "
                        "DDP advises")
    return start + ("A second backward through the same graph (retain_graph=True), or a "
                    "parameter reused in several reentrant backward passes (checkpoint), makes "
                    "this. Add the losses and call backward once, or run the earlier backward "
                    "inside no_sync() (its forward too)")


def params_outside(output, params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Those of ``params`` that ``output``'s autograd graph does not reach (as DDP looks for
    them with ``find_unused_parameters=True``): no gradient will come for them this time."""
    stack = [t.grad_fn for t in tensors_in(output) if t.grad_fn is not None]
    seen, kept, reached = set(), [], set()  # kept: visited nodes stay alive, ids unique
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kept.append(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node: it feeds a parameter
            reached.add(id(node.variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return [p for p in params if id(p) not in reached]
