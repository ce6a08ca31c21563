"""ZeRO-2 and ZeRO-3 against plain data parallelism on 1, 2 and 4 processes, in one run
(notebook 10b).

    python -m course_lib.runtime.launch --nproc 4 course_lib.demos.sharding_demo

For each group size n (1, 2, 4, ... up to the world size), ranks 0..n-1 train ``Stack`` from
the same weights on the same batches: with torch DDP (plain data parallelism), with ``Zero2``,
with the course's ``fully_shard`` (ZeRO-3) and with torch's. Each rank reports its losses, what
it holds after one step (parameters, gradients, optimizer state), the bytes it sent, and, on the
largest group, the order of the gathers, frees and reduce-scatters of one ZeRO-3 step, the
error of a bf16 all-reduce of the gradients, and ZeRO-3 with and without prefetching. Rank 0
saves it all. Gloo (CPU) or NCCL.
"""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.nn.parallel import DistributedDataParallel

from course_lib.core.collectives import ring_all_reduce
from course_lib.core.compress import bf16_all_reduce
from course_lib.core.flat_shard import FlatShard
from course_lib.core.fully_shard import bytes_sent, fully_shard, shard_module
from course_lib.core.messages import ByteCounter
from course_lib.core.overlap import OverlapDataParallel
from course_lib.core.prefetch import fully_shard as prefetch_fully_shard
from course_lib.core.zero2 import Zero2
from course_lib.lessons.memory import group_sizes, optimizer_state_bytes
from course_lib.runtime.counting import CountedAllReduce
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker

STEPS, LR = 3, 0.01
BUCKET_MB = 0.004  # about 4 kB: ZeRO-2 cuts Stack's gradients into several buckets


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h))  # a residual block


class Stack(nn.Module):
    """x (batch, 8) -> (batch, 4) through 4 blocks of width 32."""

    def __init__(self):
        super().__init__()
        self.into, self.out = nn.Linear(8, 32), nn.Linear(32, 4)
        self.blocks = nn.ModuleList([Block(32) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.into(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: inputs (6, 8), targets (6, 4)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def new_model() -> Stack:
    torch.manual_seed(0)  # every rank, every run: the same weights
    return Stack()


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each once (views share one storage)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def gathered_bytes(model: nn.Module) -> int:
    """Bytes of the wrapped modules' gathered (whole) parameters right now."""
    return sum(m.shard_state.full.untyped_storage().nbytes() for m in model.modules()
               if hasattr(m, "shard_state"))


def build(kind: str, group: dist.ProcessGroup, counter: ByteCounter):
    """The model to call, the module that holds the parameters, and the optimizer."""
    module = new_model()
    if kind == "ddp":
        model = DistributedDataParallel(module, process_group=group)
        return model, module, torch.optim.AdamW(module.parameters(), lr=LR)
    if kind == "zero2":
        opt = Zero2(module.parameters(), torch.optim.AdamW, process_group=group,
                    bucket_cap_mb=BUCKET_MB, counter=counter, lr=LR)
        return module, module, opt
    if kind == "zero3":
        shard = partial(fully_shard, process_group=group)
    else:  # torch's: the same group, as a device mesh
        shard = partial(torch_fully_shard, mesh=DeviceMesh.from_group(group, "cpu"))
    for block in module.blocks:
        shard(block)
    shard(module)  # the root last: the first and the last layer
    return module, module, torch.optim.AdamW(module.parameters(), lr=LR)


def train(kind: str, group: dist.ProcessGroup, rank: int) -> dict:
    """STEPS AdamW steps; what this rank holds after the first and what it sent."""
    counter = ByteCounter()
    model, module, opt = build(kind, group, counter)
    losses, held = [], {}
    for step in range(STEPS):
        x, y = batch(step, rank)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if kind == "zero3":
            module.finish_gradient_sync()  # nothing outside a wrapped module: nothing to do
        opt.step()
        if step == 0 and kind != "torch fsdp":
            held = holdings(kind, module, opt)
        opt.zero_grad()
        losses.append(loss.item())
    sent = counter.bytes_sent if kind == "zero2" else bytes_sent(module) if kind == "zero3" else 0
    return {"losses": losses, "sent_per_step": sent // STEPS, **held}


def holdings(kind: str, module: nn.Module, opt) -> dict:
    """Bytes this rank holds after a step, before zero_grad: parameters (the flat buffers or
    shards they live in), gradients, optimizer state; and the optimizer's tensors."""
    tensors = list(module.parameters())
    if kind == "zero2":
        tensors += [b.piece for b in opt.buckets]
    grads = [t.grad for t in tensors if t.grad is not None]
    state = opt.inner if kind == "zero2" else opt
    return {"params": storage_bytes(module.parameters()) + gathered_bytes(module),
            "grads": storage_bytes(grads), "state": optimizer_state_bytes(state),
            "state_tensors": len(state.state), "units": count_units(kind, module, opt)}


def count_units(kind: str, module: nn.Module, opt) -> int:
    """Flat pieces padded to a multiple of N: ZeRO-2's buckets, ZeRO-3's wrapped modules."""
    if kind == "zero2":
        return len(opt.buckets)
    return sum(hasattr(m, "shard_state") for m in module.modules()) if kind == "zero3" else 0


def plain_bytes(group: dist.ProcessGroup) -> int:
    """What a rank sends in one ring all-reduce of every gradient: plain data parallelism."""
    counter = ByteCounter()
    numel = sum(p.numel() for p in new_model().parameters())
    ring_all_reduce(torch.zeros(numel), group, counter)
    return counter.bytes_sent


class RecordingShard(FlatShard):
    """A flat shard that writes down its gathers, frees and reduce-scatters, in order."""

    events: list = []  # (module name, event, gathered bytes of the whole model after it)
    model: nn.Module | None = None

    def record(self, event: str) -> None:
        name = next(n or "root" for n, m in self.model.named_modules()
                    if getattr(m, "shard_state", None) is self)
        self.events.append((name, event, gathered_bytes(self.model)))

    def unshard(self, async_op: bool = False):
        if self.is_unsharded():
            return None
        work = super().unshard(async_op)
        self.record("gather")
        return work

    def reshard(self) -> None:
        was_whole = self.is_unsharded()
        super().reshard()
        if was_whole and self.model is not None:
            self.record("free")

    def reduce_grad(self, full: torch.Tensor) -> None:
        self.record("reduce-scatter")
        super().reduce_grad(full)


def timeline(group: dist.ProcessGroup, rank: int) -> list:
    """The events of one ZeRO-3 step (forward and backward), in the order they happen."""
    module = new_model()
    for block in module.blocks:
        shard_module(block, RecordingShard, group, True, None)
    shard_module(module, RecordingShard, group, True, None)
    RecordingShard.model, RecordingShard.events = module, []
    x, y = batch(0, rank)
    loss = F.mse_loss(module(x), y)
    RecordingShard.events.append(("loss", "backward starts", gathered_bytes(module)))
    loss.backward()
    return list(RecordingShard.events)


def watch_gathered(module: nn.Module) -> list[int]:
    """[the most bytes whole at once when a block starts to compute], kept up to date."""
    peak = [0]

    def note(*_) -> None:
        peak[0] = max(peak[0], gathered_bytes(module))

    for block in module.blocks:
        block.register_forward_pre_hook(note)  # after the block's own pre-hook: its gather
    return peak


def prefetching(group: dist.ProcessGroup, rank: int, steps: int = 6) -> dict:
    """ZeRO-3 with and without prefetching (prefetch.py): each step's loss, its time (the
    slowest rank's; the first step, which records the order, left out), and the most bytes
    whole at once when a block starts its forward."""
    runs = {}
    for kind, wrap in (("plain", fully_shard), ("prefetch", prefetch_fully_shard)):
        module = new_model()
        for block in module.blocks:
            wrap(block, process_group=group)
        wrap(module, process_group=group)  # the root last
        peak, opt = watch_gathered(module), torch.optim.AdamW(module.parameters(), lr=LR)
        losses, times = [], []
        for step in range(steps):
            dist.barrier(group=group)
            start = time.perf_counter()
            x, y = batch(step, rank)
            loss = F.mse_loss(module(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank
            losses.append(loss.item())
            times.append(elapsed.item())
        runs[kind] = {"losses": losses, "step_s": times[1:], "peak_whole_bytes": peak[0]}
    return runs


def compression(group: dist.ProcessGroup, rank: int) -> dict:
    """One backward, gradients all-reduced in fp32 and in bf16 (kept in fp32): error, bytes."""
    grads, sent = {}, {}
    for kind in ("fp32", "bf16"):
        counter = ByteCounter()
        all_reduce = (partial(bf16_all_reduce, counter=counter) if kind == "bf16"
                      else CountedAllReduce(dist.all_reduce))
        module = new_model()
        model = OverlapDataParallel(module, group, all_reduce=all_reduce)
        x, y = batch(0, rank)
        F.mse_loss(model(x), y).backward()
        model.finish_gradient_sync()
        sent[kind] = counter.bytes_sent if kind == "bf16" else all_reduce.bytes
        grads[kind] = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    error = (grads["bf16"] - grads["fp32"]).abs().max() / grads["fp32"].abs().max()
    return {"relative_error": float(error), "fp32_bytes": sent["fp32"],
            "bf16_bytes": sent["bf16"], "grad_dtype": str(grads["bf16"].dtype)}


def run_size(n: int, group: dist.ProcessGroup, rank: int) -> dict:
    runs = {kind: train(kind, group, rank) for kind in ("ddp", "zero2", "zero3", "torch fsdp")}
    return {"rank": rank, "numel": sum(p.numel() for p in new_model().parameters()),
            "plain_sent_per_step": plain_bytes(group), "runs": runs}


def main() -> None:
    with worker(seed=0) as w:
        sizes = group_sizes(w.world_size)
        groups = [dist.new_group(list(range(n))) for n in sizes]  # every rank makes each
        report = {"world_size": w.world_size, "by_size": {}}
        for n, group in zip(sizes, groups, strict=True):
            if w.rank < n:
                every = [None] * n
                dist.all_gather_object(every, run_size(n, group, w.rank), group=group)
                report["by_size"][str(n)] = every
                print0(w, f"{n} process(es): trained with DDP, ZeRO-2, ZeRO-3, torch FSDP")
        report["timeline"] = timeline(w.group, w.rank)
        report["compression"] = compression(w.group, w.rank)
        report["prefetching"] = prefetching(w.group, w.rank)
        save_result(report)


if __name__ == "__main__":
    main()
