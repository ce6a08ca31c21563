"""torch DDP in practice: no_sync, our trainer against DDP, SyncBatchNorm (notebook 09).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.ddp_practice

Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process). Rank 0 saves three reports:

- ``no_sync``: DDP with gradient accumulation, ``no_sync()`` placed four ways (around forward
  and backward, forward only, backward only, nowhere). A communication hook counts DDP's bucket
  all-reduces after each micro-step; the gradients are compared with one process's gradient
  of the whole global batch.
- ``trainer``: ``course_lib.train`` run with ``--sync ddp`` and with our ``--sync overlap``:
  the per-step losses.
- ``sync_batchnorm``: BatchNorm statistics of the global batch, made from all-reduced sums
  (``sync_batch_norm``), against one process's BatchNorm of the whole batch and a per-rank
  BatchNorm; on GPUs ``nn.SyncBatchNorm`` too (on CPUs it refuses to run: its message is kept).

``sampler_orders`` (no processes needed) shows what ``DistributedSampler`` hands each rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from course_lib.lessons.gradients import flat_grad
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import Worker, print0, worker
from course_lib.tasks.batching import micro_batches_of_rank

ACCUM_STEPS = 4  # micro-steps per optimizer step in the no_sync demo
MICRO_BATCH = 8  # examples per rank per micro-step
FEATURES = 16  # inputs of the small model
PLACEMENTS = ("forward and backward", "forward only", "backward only", "nowhere")  # no_sync
BN_CHANNELS = 4  # channels of the BatchNorm demo
BN_LOCAL_BATCH = 6  # examples per rank in the BatchNorm demo
TRAIN_STEPS = 4  # optimizer steps of each trainer run (small for speed)


def small_model(seed: int = 0) -> nn.Sequential:
    """The same weights for any caller with the same seed; small for speed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def global_data(seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch drawn from ``seed`` alone: x (size, FEATURES), y (size, 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, FEATURES, generator=g)
    return x, x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(size, 1, generator=g)


class HookState:
    """What the communication hook needs, and what it counts."""

    def __init__(self, group: dist.ProcessGroup, world_size: int):
        self.group, self.world_size = group, world_size
        self.calls = 0  # bucket all-reduces so far


def counting_hook(state: HookState, bucket):
    """A DDP communication hook that does what DDP does by default (average each bucket over
    the ranks) and counts the buckets it all-reduces. Returns a future of the bucket."""
    state.calls += 1
    tensor = bucket.buffer().div_(state.world_size)  # the sum of g / N is the mean
    work = dist.all_reduce(tensor, group=state.group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def big_batch_grad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One process, the whole global batch: the gradient every placement must reproduce."""
    model = small_model(0)
    F.mse_loss(model(x), y).backward()
    return flat_grad(model).detach().cpu()


def accumulate_with_ddp(w: Worker, placement: str) -> dict:
    """One optimizer step of DDP with ACCUM_STEPS micro-steps, no_sync placed as asked."""
    model = small_model(0).to(w.device)
    ddp = DDP(model, device_ids=[w.local_rank] if w.device.type == "cuda" else None,
              process_group=w.group)
    counter = HookState(w.group, w.world_size)
    ddp.register_comm_hook(counter, counting_hook)
    x, y = global_data(1, w.world_size * ACCUM_STEPS * MICRO_BATCH)
    parts = micro_batches_of_rank((x, y), w.rank, w.world_size, ACCUM_STEPS)
    calls = []
    for k, (xb, yb) in enumerate(parts):
        xb, yb = xb.to(w.device), yb.to(w.device)
        last = k == ACCUM_STEPS - 1
        if last or placement == "nowhere":
            loss = F.mse_loss(ddp(xb), yb) / ACCUM_STEPS  # k scaled means sum to the mean
            loss.backward()
        elif placement == "forward and backward":
            with ddp.no_sync():  # DDP decides during the forward whether backward syncs
                loss = F.mse_loss(ddp(xb), yb) / ACCUM_STEPS
                loss.backward()
        elif placement == "forward only":  # the backward runs outside, and still no sync
            with ddp.no_sync():
                loss = F.mse_loss(ddp(xb), yb) / ACCUM_STEPS
            loss.backward()
        else:  # "backward only": the forward already armed DDP's hooks
            loss = F.mse_loss(ddp(xb), yb) / ACCUM_STEPS
            with ddp.no_sync():
                loss.backward()
        calls.append(counter.calls - sum(calls))  # bucket all-reduces in this micro-step
    ours, reference = flat_grad(model).detach().cpu(), big_batch_grad(x, y)
    return {"placement": placement, "all_reduces_per_micro_step": calls,
            "grad_matches_big_batch": bool(torch.allclose(ours, reference, rtol=1e-5,
                                                          atol=1e-6)),
            "max_difference": float((ours - reference).abs().max())}


def trainer_against_ddp(w: Worker) -> dict:
    """``course_lib.train`` with DDP and with our overlapped buckets: losses per step."""
    from course_lib.runtime.worker import seed_everything
    from course_lib.train.config import TrainConfig
    from course_lib.train.trainer import train

    config = TrainConfig(steps=TRAIN_STEPS, accum_steps=2, micro_batch=4, bucket_mb=0.01,
                         log_every=TRAIN_STEPS)
    losses = {}
    for sync in ("ddp", "overlap"):
        seed_everything(config.seed + w.rank)  # each run from the same start
        losses[sync] = train(config, w, sync)["losses"]
    return losses


class AllReduceSum(torch.autograd.Function):
    """The sum over ranks, which autograd can go through: every rank uses the sum, so the
    gradient that reaches each rank's input is the sum of every rank's incoming gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)  # d(sum of all losses) / d(my input)
        return grad, None


def sync_batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    group: dist.ProcessGroup, eps: float = 1e-5) -> torch.Tensor:
    """BatchNorm of x (local_batch, channels) with the mean and variance of the GLOBAL batch.

    Each rank all-reduces three sums: of x, of x squared and of the example count. Through
    ``AllReduceSum`` the backward pass also reaches the other ranks' inputs, as in one big
    BatchNorm (nn.SyncBatchNorm does the same, with fused GPU kernels).
    """
    channels = x.shape[1]
    count = torch.full((1,), float(x.shape[0]), dtype=x.dtype, device=x.device)
    local = torch.cat([x.sum(0), (x * x).sum(0), count])  # (2 * channels + 1,)
    total = AllReduceSum.apply(local, group)  # the sums over every rank's examples
    n = total[-1]
    mean = total[:channels] / n  # (channels,) the global batch's mean
    var = total[channels:2 * channels] / n - mean * mean  # biased, as BatchNorm normalises
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def batchnorm_data(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (world x BN_LOCAL_BATCH, channels), off-centre, and fixed loss weights."""
    g = torch.Generator().manual_seed(2)
    size = world_size * BN_LOCAL_BATCH
    x = 3.0 + 2.0 * torch.randn(size, BN_CHANNELS, generator=g, dtype=torch.float64)
    return x.float(), torch.randn(size, BN_CHANNELS, generator=g)


def batchnorm_check(w: Worker) -> dict:
    """Global-batch BatchNorm from all-reduced sums == one BatchNorm of the whole batch."""
    x_all, weights = batchnorm_data(w.world_size)
    rows = slice(w.rank * BN_LOCAL_BATCH, (w.rank + 1) * BN_LOCAL_BATCH)  # this rank's part
    reference = nn.BatchNorm1d(BN_CHANNELS)
    x_ref = x_all.clone().requires_grad_(True)
    out_ref = reference(x_ref)  # one process, the whole batch
    ((out_ref * weights).sum() / len(x_all)).backward()
    own = nn.BatchNorm1d(BN_CHANNELS).to(w.device)
    x = x_all[rows].to(w.device).requires_grad_(True)
    out = sync_batch_norm(x, own.weight, own.bias, w.group)
    ((out * weights[rows].to(w.device)).sum() / len(x_all)).backward()
    grads = torch.cat([own.weight.grad, own.bias.grad])
    dist.all_reduce(grads, group=w.group)  # gamma and beta gradients: the sum over ranks
    with torch.no_grad():
        local_out = nn.BatchNorm1d(BN_CHANNELS).to(w.device)(x_all[rows].to(w.device))
    return {
        "sync_output_matches": close(out, out_ref[rows]),
        "sync_input_grad_matches": close(x.grad, x_ref.grad[rows]),
        "sync_weight_grads_match": close(grads, torch.cat([reference.weight.grad,
                                                           reference.bias.grad])),
        "per_rank_output_matches": close(local_out, out_ref[rows]),
        "per_rank_max_difference": float((local_out.cpu() - out_ref[rows].detach()).abs().max()),
        "torch_sync_batchnorm": torch_sync_batchnorm(w, x_all[rows], out_ref[rows]),
    }


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a.detach().cpu(), b.detach().cpu(), rtol=1e-5, atol=1e-5))


def torch_sync_batchnorm(w: Worker, x: torch.Tensor, expected: torch.Tensor) -> str:
    """nn.SyncBatchNorm on this rank's part: "matches" on GPUs; its refusal on CPUs."""
    layer = nn.SyncBatchNorm(BN_CHANNELS, process_group=w.group).to(w.device)
    try:
        out = layer(x.to(w.device))
    except ValueError as e:
        return f"refused: {str(e).splitlines()[0]}"
    return "matches" if close(out, expected) else "differs"


def sampler_orders(dataset_size: int, world_size: int, epochs: int, set_epoch: bool,
                   seed: int = 0, drop_last: bool = False) -> list[list[list[int]]]:
    """``orders[epoch][rank]``: the indices DistributedSampler gives each rank in each epoch."""
    samplers = [DistributedSampler(range(dataset_size), num_replicas=world_size, rank=rank,
                                   shuffle=True, seed=seed, drop_last=drop_last)
                for rank in range(world_size)]
    orders = []
    for epoch in range(epochs):
        for sampler in samplers:
            if set_epoch:
                sampler.set_epoch(epoch)  # the shuffle's seed becomes seed + epoch
        orders.append([list(sampler) for sampler in samplers])
    return orders


def main() -> None:
    with worker(seed=0) as w:
        report = {"world_size": w.world_size, "backend": w.backend,
                  "no_sync": [accumulate_with_ddp(w, p) for p in PLACEMENTS]}
        print0(w, "no_sync placements done")
        report["sync_batchnorm"] = batchnorm_check(w)
        print0(w, "BatchNorm checks done")
        report["trainer"] = trainer_against_ddp(w)
        save_result(report)


if __name__ == "__main__":
    main()
