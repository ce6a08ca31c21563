"""ZeRO-1 against plain data parallelism, and optimizer memory per rank for 1, 2 and 4
processes, all in one run (notebook 10).

    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.zero_demo
    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.zero_demo --sizes 1,2,3,4

For each size n in ``--sizes`` (default: 1, 2, 4, ... up to the world size), ranks 0..n-1 form
a group and train the tiny transformer twice from the same weights on the same batches: with
plain data parallelism (all-reduce every gradient, a whole AdamW on every rank) and with
``course_lib.core.zero.Zero1``. The other ranks wait for the next size. Rank 0 saves, per size:
whether the parameters agree, the optimizer state of every rank of the group, and the bytes
each rank sent. Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from course_lib.core.accumulation import (
    all_reduce_token_count,
    count_target_tokens,
    scale_by_global_tokens,
    sum_token_loss,
)
from course_lib.core.collectives import ByteCounter, ring_all_reduce
from course_lib.core.train_step import finish_sync
from course_lib.core.zero import Zero1
from course_lib.lessons.memory import group_sizes, optimizer_state_bytes
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker
from course_lib.tasks.batching import micro_batch
from course_lib.tasks.models import make_transformer, parameter_vector
from course_lib.tasks.sequences import global_batch
from course_lib.train.syncs import wrap_model

STEPS = 5  # optimizer steps per run
GLOBAL_BATCH = 24  # examples per step: divisible by 1, 2, 3, 4
LR = 3e-3
WEIGHT_DECAY = 0.01
MAX_NORM = 1.0  # gradient clipping, global norm


def local_loss(model, part, global_tokens, size: int) -> torch.Tensor:
    """This rank's share of the mean token loss over the whole global batch."""
    loss_sum = sum_token_loss(model(part.inputs), part.targets)
    return scale_by_global_tokens(loss_sum, global_tokens, size)  # x size: the sync averages


def train_both(size: int, group: dist.ProcessGroup, rank: int, device: torch.device) -> dict:
    """Train plain DP and ZeRO-1 side by side on a group of ``size`` ranks."""
    plain = wrap_model("allreduce", make_transformer(seed=0, device=device), group, device)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sharded, counter = make_transformer(seed=0, device=device), ByteCounter()
    zero = Zero1(sharded.parameters(), torch.optim.AdamW, group, max_grad_norm=MAX_NORM,
                 counter=counter, lr=LR, weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        part = micro_batch(global_batch(0, step, GLOBAL_BATCH), rank, 0, size, 1).to(device)
        tokens = all_reduce_token_count(count_target_tokens(part.targets), group)
        local_loss(plain, part, tokens, size).backward()
        finish_sync(plain)  # all-reduce every gradient: the mean over ranks
        torch.nn.utils.clip_grad_norm_(plain.parameters(), MAX_NORM)
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)
        local_loss(sharded, part, tokens, size).backward()  # local gradients only
        zero.step()  # reduce-scatter, clip, update my chunk, all-gather
        zero.zero_grad()
    ours, theirs = parameter_vector(sharded), parameter_vector(plain.module)
    reference = ByteCounter()  # what one ring all-reduce of every gradient sends
    ring_all_reduce(torch.zeros_like(zero.flat_grad), group=group, counter=reference)
    return {"rank": rank, "plain_state_bytes": optimizer_state_bytes(plain_opt),
            "zero_state_bytes": optimizer_state_bytes(zero.inner),
            "owned": [zero.start, zero.end], "pieces": len(zero.pieces),
            "param_bytes": zero.flat.numel() * zero.flat.element_size(),
            "zero_bytes_sent_per_step": counter.bytes_sent // STEPS,
            "ring_all_reduce_bytes": reference.bytes_sent,
            "max_difference": float((ours - theirs).abs().max()),
            "params_close": bool(torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5))}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help="group sizes, e.g. 1,2,4 (<= world size)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    with worker(seed=0) as w:
        sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
                 else group_sizes(w.world_size))
        if any(not 1 <= n <= w.world_size for n in sizes):
            raise ValueError(f"--sizes {args.sizes} must lie in 1..{w.world_size} "
                             "(the number of processes); launch more processes or drop some")
        groups = [dist.new_group(list(range(n))) for n in sizes]  # every rank makes each
        report = {"world_size": w.world_size, "backend": w.backend, "by_size": {}}
        for n, group in zip(sizes, groups, strict=True):
            if w.rank < n:
                mine = train_both(n, group, w.rank, w.device)
                every = [None] * n
                dist.all_gather_object(every, mine, group=group)
                report["by_size"][str(n)] = every
                print0(w, f"{n} process(es): ZeRO-1 state on rank 0 "
                          f"{mine['zero_state_bytes']} bytes, plain {mine['plain_state_bytes']}")
        save_result(report)


if __name__ == "__main__":
    main()
