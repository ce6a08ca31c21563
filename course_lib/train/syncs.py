"""The gradient syncs ``python -m course_lib.train --sync NAME`` can use (notebooks 07-09).

Every one wraps the model so that ``course_lib.core.train_step`` drives them alike:

    ddp        torch's DistributedDataParallel (buckets sent from hooks, in C++)
    naive      ours, one all-reduce per parameter: naive_all_reduce (course_lib/core)
    ring       ours, one all-reduce per parameter: ring_all_reduce
    allreduce  ours, one all-reduce per parameter: torch.distributed.all_reduce
    bucketed   ours, flat buckets after backward (torch's all_reduce per bucket)
    overlap    ours, buckets all-reduced from gradient hooks while backward runs
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_lib.core.buckets import BucketedDataParallel
from course_lib.core.collectives import naive_all_reduce, ring_all_reduce
from course_lib.core.data_parallel import AllReducePerParameter
from course_lib.core.overlap import OverlapDataParallel
from course_lib.runtime.counting import CountedAllReduce

PER_PARAMETER = {"naive": naive_all_reduce, "ring": ring_all_reduce,
                 "allreduce": dist.all_reduce}
SYNCS = ("ddp", *PER_PARAMETER, "bucketed", "overlap")


def wrap_model(name: str, module: nn.Module, group: dist.ProcessGroup, device,
               bucket_mb: float | None = 25.0, find_unused_parameters: bool = False,
               recorder=CountedAllReduce):
    """``module`` wrapped for the sync ``name``. Ours also get ``.recorder``: their all-reduce
    wrapped by ``recorder``, which counts the calls and the bytes handed to them
    (``course_lib.lessons.timeline.CommRecorder`` times them too, for notebook 08's picture)."""
    if name == "ddp":
        return DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None,
            process_group=group, bucket_cap_mb=bucket_mb,
            find_unused_parameters=find_unused_parameters)
    if name in PER_PARAMETER:
        counted = recorder(PER_PARAMETER[name])
        model = AllReducePerParameter(module, group, counted, find_unused_parameters)
    elif name == "bucketed":
        counted = recorder(dist.all_reduce)
        model = BucketedDataParallel(module, group, bucket_mb, counted, find_unused_parameters)
    elif name == "overlap":
        counted = recorder(dist.all_reduce)
        model = OverlapDataParallel(module, group, bucket_mb, counted, find_unused_parameters)
    else:
        raise ValueError(f"unknown sync {name!r}; pick one of {', '.join(SYNCS)}")
    model.recorder = counted
    return model
