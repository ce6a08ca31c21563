"""How ``course_lib.train`` averages gradients: torch DDP or our own GradSync (notebooks 07-09).

Both wrappers offer the same four calls to the training loop:

    with sync.context(last):            # DDP: no_sync() on every micro-step but the last
        loss = loss_fn(sync.model(x))   # sync.model: what to call forward on
        sync.backward(loss, last)       # only the last micro-step communicates
    sync.finish()                       # every .grad now holds the mean over ranks
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from course_lib.runtime.worker import Worker
from course_lib.train.config import TrainConfig


class DDPSync:
    """torch DDP: averages gradients in buckets while backward runs."""

    def __init__(self, model, w: Worker, config: TrainConfig, name: str = "ddp"):
        self.module = model
        self.model = DistributedDataParallel(  # broadcasts rank 0's weights here
            model, device_ids=[w.local_rank] if w.device.type == "cuda" else None,
            process_group=w.group, bucket_cap_mb=config.bucket_mb)

    def context(self, last: bool):
        # no_sync must wrap the forward too: DDP prepares its hooks during the forward
        return contextlib.nullcontext() if last else self.model.no_sync()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def finish(self) -> None:
        pass

    def report(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class HandSync:
    """Our own data parallelism (course_lib.core.data_parallel), same job as DDPSync."""

    def __init__(self, model, w: Worker, config: TrainConfig, name: str):
        from course_lib.core.data_parallel import GradSync, broadcast_parameters

        broadcast_parameters(model, w.group)  # rank 0's weights everywhere
        self.module = self.model = model
        self.grad_sync = GradSync(model, w.group, strategy=name,
                                  bucket_mb=config.bucket_mb, comm=config.bucket_comm)

    def context(self, last: bool):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.grad_sync.backward(loss, sync=last)  # communicates on the last micro-step only

    def finish(self) -> None:
        self.grad_sync.finish()  # every .grad now holds the mean over ranks

    def report(self) -> dict:
        return {"sync_totals": dict(self.grad_sync.totals),
                "timeline": list(self.grad_sync.timeline)}

    def close(self) -> None:
        self.grad_sync.remove_hooks()


def make_sync(name: str, model: torch.nn.Module, w: Worker, config: TrainConfig):
    """DDPSync for "ddp", else HandSync with that GradSync strategy."""
    return (DDPSync if name == "ddp" else HandSync)(model, w, config, name)
