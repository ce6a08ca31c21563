"""ZeRO-2, ZeRO-3 (``fully_shard``), prefetching and bf16 compression against torch, launched
by tests/test_fully_shard.py and tests/test_zero2.py (one launch per world size, any size).

Every check runs here on every rank; rank 0 hands back, for each, the worst difference over the
ranks and whether every rank was bitwise equal. The models are small for test speed:
``Net`` has every case at once (a tied weight, a module used twice in forward, parameters
smaller than the world size, one outside any block); ``Stack`` is a plain stack of blocks for
the bytes and memory counts. With 4 ranks the memory check also runs on groups of 1 and 2.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.nn.parallel import DistributedDataParallel

from course_lib.core import prefetch
from course_lib.core.collectives import ring_all_reduce
from course_lib.core.compress import bf16_all_reduce, bf16_comm_hook
from course_lib.core.fully_shard import (
    MixedPrecisionPolicy,
    bytes_sent,
    finish_gradient_sync,
    full_state_dict,
    fully_shard,
)
from course_lib.core.messages import ByteCounter
from course_lib.core.overlap import OverlapDataParallel
from course_lib.core.zero2 import Zero2
from course_lib.lessons.memory import optimizer_state_bytes
from course_lib.runtime.counting import CountedAllReduce
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import worker

STEPS, VOCAB, WIDTH = 3, 11, 8
SMALL_MB = 0.0005  # about 500 bytes: several ZeRO-2 buckets even for these models
OPTIMIZERS = {"sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
              "adamw": partial(torch.optim.AdamW, lr=0.01, weight_decay=0.1)}
CASES = {"sgd": ("sgd", None), "adamw": ("adamw", None), "adamw bf16": ("adamw", torch.bfloat16)}


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.gate = nn.Parameter(torch.full((1,), 0.5))  # 1 value: fewer than the ranks

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h)) * self.gate


class Net(nn.Module):
    """Tokens (batch, 5) -> logits (batch, 5, VOCAB); the head is tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(WIDTH), Block(WIDTH)])
        self.twice = Block(WIDTH)  # used twice in every forward
        self.temperature = nn.Parameter(torch.ones(1))  # outside every block
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two modules

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.twice(self.twice(h))) * self.temperature


class Stack(nn.Module):
    """x (batch, 8) -> (batch, 4) through 4 blocks of width 32: each block used once."""

    def __init__(self):
        super().__init__()
        self.into, self.out = nn.Linear(8, 32), nn.Linear(32, 4)
        self.blocks = nn.ModuleList([Block(32) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.into(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def data(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: tokens (4, 5) and targets (4, 5)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, VOCAB, (4, 5), generator=g), torch.randint(0, VOCAB, (4, 5),
                                                                       generator=g)


def loss_of(model: nn.Module, step: int, rank: int) -> torch.Tensor:
    x, y = data(step, rank)
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


def worst(value: float, group=None) -> float:
    """The largest ``value`` over the ranks."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def everywhere(flag: bool, group=None) -> bool:
    return worst(0.0 if flag else 1.0, group) == 0.0


def differences(ours: dict, theirs: dict) -> dict:
    """Worst difference over the ranks between two runs (losses and parameters by name)."""
    loss = max(abs(a - b) for a, b in zip(ours["losses"], theirs["losses"], strict=True))
    same_names = sorted(ours["params"]) == sorted(theirs["params"])
    param = max((ours["params"][n] - t).abs().max().item() for n, t in theirs["params"].items())
    bitwise = loss == 0 and all(torch.equal(ours["params"][n], t)
                                for n, t in theirs["params"].items())
    return {"loss": worst(loss), "param": worst(param), "bitwise": everywhere(bitwise),
            "same_names": everywhere(same_names)}


def train_sharded(w, shard, optimizer: str, dtype, wrap_root: bool = True) -> dict:
    """STEPS steps of ``Net`` with ``shard`` (ours, ours with prefetch, or torch's)."""
    torch.manual_seed(0)
    model = Net()
    theirs = shard is torch_fully_shard
    policy = (TorchPolicy if theirs else MixedPrecisionPolicy)(param_dtype=dtype)
    for module in [*model.blocks, model.twice, *([model] if wrap_root else [])]:
        shard(module, mp_policy=policy)
    opt = OPTIMIZERS[optimizer](model.parameters())
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, step, w.rank)
        loss.backward()
        if not wrap_root:
            finish_gradient_sync(model)  # the root's parameters are replicated: all-reduce
        elif not theirs:
            model.finish_gradient_sync()  # nothing left to do: shown as a learner calls it
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = ({n: p.full_tensor() for n, p in model.named_parameters()} if theirs
              else full_state_dict(model))
    return {"losses": losses, "params": params, "sent": 0 if theirs else bytes_sent(model)}


def train_unsharded(w, optimizer: str) -> dict:
    """One process, every rank's batch: the mean loss over the ranks, as data parallelism."""
    torch.manual_seed(0)
    model = Net()
    opt = OPTIMIZERS[optimizer](model.parameters())
    losses = []
    for step in range(STEPS):
        each = [loss_of(model, step, r) for r in range(w.world_size)]
        (sum(each) / w.world_size).backward()
        opt.step()
        opt.zero_grad()
        losses.append(each[w.rank].item())
    return {"losses": losses, "params": {n: p.detach() for n, p in model.named_parameters()}}


def fully_shard_checks(w) -> dict:
    """Ours against torch's fully_shard, against one process, and with prefetching."""
    unsharded = {name: train_unsharded(w, name) for name in OPTIMIZERS}
    ours = {case: train_sharded(w, fully_shard, *how) for case, how in CASES.items()}
    vs_torch = {case: differences(ours[case], train_sharded(w, torch_fully_shard, *how))
                for case, how in CASES.items()}
    vs_unsharded = {case: differences(ours[case], unsharded[case]) for case in OPTIMIZERS}
    vs_unsharded["sgd root unwrapped"] = differences(
        train_sharded(w, fully_shard, "sgd", None, wrap_root=False), unsharded["sgd"])
    prefetched = train_sharded(w, prefetch.fully_shard, *CASES["adamw bf16"])
    same_bytes = prefetched["sent"] == ours["adamw bf16"]["sent"]  # no gather wasted
    return {"vs_torch": vs_torch, "vs_unsharded": vs_unsharded,
            "prefetch": {**differences(prefetched, ours["adamw bf16"]),
                         "same_bytes": everywhere(same_bytes)}}


def zero2_checks(w) -> dict:
    """ZeRO-2 against torch DDP, AdamW, several buckets: parameters after STEPS steps."""
    runs = {}
    for kind in ("ddp", "zero2"):
        torch.manual_seed(0)
        module = Net()
        if kind == "ddp":
            model = DistributedDataParallel(module, process_group=w.group, bucket_cap_mb=SMALL_MB)
            opt = OPTIMIZERS["adamw"](module.parameters())
        else:
            model = module  # no wrapper: the optimizer's hooks do the communication
            opt = Zero2(module.parameters(), torch.optim.AdamW, process_group=w.group,
                        bucket_cap_mb=SMALL_MB, lr=0.01, weight_decay=0.1)
        losses, freed = [], True
        for step in range(STEPS):
            loss = loss_of(model, step, w.rank)
            loss.backward()
            freed &= all(p.grad is None for p in module.parameters())
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        params = {n: p.detach() for n, p in module.named_parameters()}
        runs[kind] = {"losses": losses, "params": params, "freed": freed, "opt": opt}
    result = differences(runs["zero2"], runs["ddp"])
    result["buckets"] = len(runs["zero2"]["opt"].buckets)
    result["grads_freed"] = everywhere(runs["zero2"]["freed"])
    return result


def one_step_bytes(w, group, kind: str, dtype=None) -> dict:
    """One AdamW step of ``Stack`` under ``kind``, on ``group``: what each rank holds after it
    (storage bytes of parameters, gradients and optimizer state) and what it sent."""
    torch.manual_seed(0)
    model, counter = Stack(), ByteCounter()
    numel = sum(p.numel() for p in model.parameters())
    gathered = []  # bytes of the parameters whole at once, seen inside each block's forward
    if kind == "zero2":
        opt = Zero2(model.parameters(), torch.optim.AdamW, process_group=group,
                    bucket_cap_mb=0.004, counter=counter, lr=0.01)
    else:
        for block in model.blocks:
            fully_shard(block, process_group=group,
                        mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
            block.register_forward_pre_hook(lambda *_: gathered.append(full_bytes(model)))
        fully_shard(model, process_group=group, mp_policy=MixedPrecisionPolicy(param_dtype=dtype))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(dist.get_rank(group)))
    model(x).square().mean().backward()
    opt.step()
    state = opt.inner if kind == "zero2" else opt
    params = storage_bytes(model.parameters()) + full_bytes(model)
    grads = storage_bytes(t.grad for t in [*model.parameters(), *pieces(opt)]
                          if t.grad is not None)
    sent = counter.bytes_sent if kind == "zero2" else bytes_sent(model)
    return {"numel": numel, "params": params, "grads": grads,
            "state": optimizer_state_bytes(state), "sent": sent,
            "after_step_whole": full_bytes(model), "most_whole_in_forward": max(gathered or [0]),
            "units": [m.shard_state.shard_numel for m in model.modules()  # the root first
                      if hasattr(m, "shard_state")],
            "pieces": len(opt.buckets) if kind == "zero2" else len(model.blocks) + 1}


def pieces(opt) -> list[torch.Tensor]:
    return [b.piece for b in opt.buckets] if isinstance(opt, Zero2) else []


def full_bytes(model: nn.Module) -> int:
    """Bytes of the gathered (whole) parameters of every wrapped module right now."""
    return sum(m.shard_state.full.untyped_storage().nbytes() for m in model.modules()
               if hasattr(m, "shard_state"))


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (views share one)."""
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def plain_bytes(w) -> int:
    """What a rank sends in plain data parallelism: the ring all-reduce of every gradient."""
    counter = ByteCounter()
    ring_all_reduce(torch.zeros(sum(p.numel() for p in Stack().parameters())), w.group, counter)
    return counter.bytes_sent


def torch_bf16_hook(process_group, bucket):
    """torch's own hook under another name: DDP refuses the name without CUDA and NCCL."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


def compress_checks(w) -> dict:
    """bf16 compression: torch DDP with our hook and with torch's; our wrapper with our
    all-reduce and with torch's fp32 one. Gradients of one backward of ``Stack``."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(w.rank))
    grads, bytes_in = {}, {}
    for kind in ("ddp", "ddp ours", "ddp torch's", "wrapper", "wrapper ours"):
        torch.manual_seed(0)
        module = Stack()
        if kind.startswith("ddp"):
            model = DistributedDataParallel(module, process_group=w.group)
            hook = {"ddp ours": bf16_comm_hook, "ddp torch's": torch_bf16_hook}.get(kind)
            if hook is not None:
                model.register_comm_hook(w.group, hook)
        else:
            counter = ByteCounter()
            all_reduce = (partial(bf16_all_reduce, counter=counter) if kind == "wrapper ours"
                          else CountedAllReduce(dist.all_reduce))
            model = OverlapDataParallel(module, w.group, all_reduce=all_reduce)
        model(x).square().mean().backward()
        if kind.startswith("wrapper"):
            model.finish_gradient_sync()
            bytes_in[kind] = counter.bytes_sent if kind == "wrapper ours" else all_reduce.bytes
        grads[kind] = torch.cat([p.grad.reshape(-1) for p in module.parameters()])

    def error(kind: str, exact: str) -> float:
        return worst(((grads[kind] - grads[exact]).abs().max() / grads[exact].abs().max()))

    return {"hook_equals_torch": everywhere(torch.equal(grads["ddp ours"], grads["ddp torch's"])),
            "hook_error": error("ddp ours", "ddp"), "wrapper_error": error("wrapper ours",
                                                                           "wrapper"),
            "fp32_bytes": bytes_in["wrapper"], "bf16_bytes": bytes_in["wrapper ours"],
            "wrapper_vs_ddp": worst((grads["wrapper"] - grads["ddp"]).abs().max())}


def memory_checks(w) -> dict:
    """What each rank holds after one step, on groups of 1, 2 and all the ranks."""
    groups = {1: dist.new_subgroups(1)[0], 2: dist.new_subgroups(2)[0], w.world_size: w.group}
    return {str(size): {"zero2": one_step_bytes(w, group, "zero2"),
                        "zero3": one_step_bytes(w, group, "zero3"),
                        "zero3 bf16": one_step_bytes(w, group, "zero3", torch.bfloat16)}
            for size, group in groups.items()}


def main() -> None:
    with worker(seed=0) as w:
        result = {"world_size": w.world_size, **fully_shard_checks(w),
                  "zero2": zero2_checks(w), "compress": compress_checks(w),
                  "bytes": {"plain": plain_bytes(w),
                            "zero2": one_step_bytes(w, w.group, "zero2")["sent"],
                            "zero3": one_step_bytes(w, w.group, "zero3")["sent"]}}
        if w.world_size == 4:
            result["memory"] = memory_checks(w)
        save_result(result)


if __name__ == "__main__":
    main()
