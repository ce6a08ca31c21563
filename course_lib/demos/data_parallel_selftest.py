"""Every gradient-sync strategy of ``course_lib.core.data_parallel``, run on every rank and compared
with the single-process big batch and torch DDP (tests/test_data_parallel.py; notebooks 07, 08).

    python -m course_lib.runtime.launch --nproc 2 course_lib.demos.data_parallel_selftest
    python -m course_lib.runtime.launch --nproc 3 \\
        course_lib.demos.data_parallel_selftest naive,overlap

The optional argument picks variants by label (``VARIANTS``; default: all of them).
Any world size >= 1, Gloo (CPU) or NCCL (one GPU per process). This module measures and the
test judges: rank 0 saves the gradients and parameters of each strategy, of one process on the
whole batch and of torch DDP, together with what was checked across ranks (bitwise equality,
collectives called during ``sync=False`` micro-steps).
"""

from __future__ import annotations

import copy
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.core.data_parallel import GradSync, broadcast_parameters
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import print0, worker
from course_lib.tasks.models import make_transformer
from course_lib.tasks.sequences import IGNORE, global_batch

SMALL_BUCKET_MB = 0.0005  # about 524 bytes: several buckets even for this tiny model
TRANSFORMER_BUCKET_MB = 0.01  # about 10 kB: a dozen buckets for the 27k-parameter transformer
MICRO_BATCH = 4  # examples per rank per micro-step; small for test speed
ACCUM_STEPS = 3  # micro-steps in the accumulation check
TRAIN_STEPS = 3  # optimizer steps in the training check (each with 2 micro-steps)
VARIANTS = {  # label: GradSync options
    "naive": {"strategy": "naive"},
    "ring": {"strategy": "ring"},
    "allreduce": {"strategy": "allreduce"},
    "bucketed": {"strategy": "bucketed", "bucket_mb": SMALL_BUCKET_MB},
    "overlap": {"strategy": "overlap", "bucket_mb": SMALL_BUCKET_MB},
    "overlap find_unused": {"strategy": "overlap", "bucket_mb": SMALL_BUCKET_MB,
                            "find_unused_parameters": True},
    "bucketed ring": {"strategy": "bucketed", "bucket_mb": SMALL_BUCKET_MB, "comm": "ring",
                      "gradient_as_bucket_view": True},
    "overlap ring": {"strategy": "overlap", "bucket_mb": SMALL_BUCKET_MB, "comm": "ring",
                     "find_unused_parameters": True, "gradient_as_bucket_view": True},
    "overlap one bucket": {"strategy": "overlap", "bucket_mb": 25.0},
}
COUNTED = ("all_reduce", "broadcast", "send", "recv", "isend", "irecv", "batch_isend_irecv",
           "all_gather", "reduce_scatter", "reduce", "gather", "scatter")  # calls watched


class SmallNet(nn.Module):
    """Parameters of several sizes, a frozen layer, a buffer, a layer never used and a branch
    (``extra``) used only when asked. Small for test speed."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 24)
        self.norm = nn.LayerNorm(24)
        self.hidden = nn.Linear(24, 12)
        self.frozen = nn.Linear(12, 12).requires_grad_(False)
        self.extra = nn.Linear(12, 12)
        self.head = nn.Linear(12, 3)
        self.unused = nn.Linear(4, 4)  # never called: no gradient on any rank
        self.register_buffer("scale", torch.rand(3) + 0.5)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.norm(self.embed(x))))  # (batch, 12)
        h = h + self.frozen(h)
        if use_extra:
            h = h + self.extra(h)
        return self.head(h) * self.scale  # (batch, 3)


def make_data(step: int, n: int, device: torch.device):
    """``n`` examples of global step ``step``: the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 6, generator=g)  # (n, 6)
    y = torch.randint(0, 3, (n,), generator=g)  # (n,)
    return x.to(device), y.to(device)


def part(t: torch.Tensor, index: int) -> torch.Tensor:
    """Micro-batch ``index`` (= micro_step * world_size + rank) of a global batch."""
    return t[index * MICRO_BATCH:(index + 1) * MICRO_BATCH]


def grads_json(model: nn.Module) -> dict:
    return {n: None if p.grad is None else p.grad.flatten().tolist()
            for n, p in model.named_parameters() if p.requires_grad}


def params_json(model: nn.Module) -> dict:
    return {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}


def flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten()
                      for p in model.parameters() if p.requires_grad])


def same_on_all_ranks(flat: torch.Tensor, group) -> bool:
    """True when every rank holds exactly the same bits."""
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, flat.contiguous(), group=group)
    return all(torch.equal(copies[0], c) for c in copies)


@contextmanager
def counting_collectives(counts: dict):
    """Count calls of torch.distributed's communication functions while inside."""
    saved = {name: getattr(dist, name) for name in COUNTED}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return counted

    for name in COUNTED:
        setattr(dist, name, wrap(name, saved[name]))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def one_step(w, make, options: dict) -> dict:
    """One synced backward on step 0's data: gradients, timeline, buckets, stats."""
    model = make()
    gs = GradSync(model, w.group, **options)
    x, y = make_data(0, w.world_size * MICRO_BATCH, w.device)
    counts: dict = {}
    with counting_collectives(counts):
        gs.backward(F.cross_entropy(model(part(x, w.rank)), part(y, w.rank)))
        gs.finish()
    out = {"grads": grads_json(model), "equal_on_ranks": same_on_all_ranks(flat_grads(model),
                                                                             w.group),
           "calls": sum(counts.values()), "stats": gs.stats, "timeline": gs.timeline,
           "buckets": [b.describe() for b in gs.buckets], "bucket_mb": gs.bucket_mb}
    gs.remove_hooks()
    return out


def accumulation(w, make, options: dict) -> dict:
    """ACCUM_STEPS micro-steps on step 1's data, synced three ways: last only, every
    micro-step, and with no_sync(). Counts communication during the unsynced ones."""
    x, y = make_data(1, w.world_size * ACCUM_STEPS * MICRO_BATCH, w.device)
    local = make()  # plain autograd on this rank's micro-batches: no communication at all
    out = {"calls_unsynced": 0, "collectives_unsynced": 0, "bytes_unsynced": 0,
           "local_untouched": True}
    for mode in ("last", "every", "no_sync"):
        model = make()
        gs = GradSync(model, w.group, **options)
        for k in range(ACCUM_STEPS):
            index = k * w.world_size + w.rank
            loss = F.cross_entropy(model(part(x, index)), part(y, index)) / ACCUM_STEPS
            final = k == ACCUM_STEPS - 1
            if mode == "every" or final:
                gs.backward(loss, sync=True)
                gs.finish()
                continue
            before, counts = dict(gs.totals), {}
            with counting_collectives(counts):
                if mode == "no_sync":
                    with gs.no_sync():
                        gs.backward(loss)
                else:
                    gs.backward(loss, sync=False)
            out["calls_unsynced"] += sum(counts.values())
            out["collectives_unsynced"] += gs.totals["collectives"] - before["collectives"]
            out["bytes_unsynced"] += gs.totals["bytes_reduced"] - before["bytes_reduced"]
            if mode == "last":
                local_loss = F.cross_entropy(local(part(x, index)), part(y, index))
                (local_loss / ACCUM_STEPS).backward()
                out["local_untouched"] &= torch.equal(flat_grads(local), flat_grads(model))
        out[f"grads_{mode}"] = grads_json(model)
        gs.remove_hooks()
    return out


def training(w, make, options: dict) -> dict:
    """TRAIN_STEPS SGD steps of 2 micro-steps each; replicas compared bitwise after each.
    Gradients are set to None and zeroed in place in turn (both must work with buckets)."""
    model = make()
    gs = GradSync(model, w.group, **options)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9)
    equal_after_step = []
    for step in range(TRAIN_STEPS):
        x, y = make_data(2 + step, w.world_size * 2 * MICRO_BATCH, w.device)
        opt.zero_grad(set_to_none=step % 2 == 0)
        for k in range(2):
            index = k * w.world_size + w.rank
            loss = F.cross_entropy(model(part(x, index)), part(y, index)) / 2
            gs.backward(loss, sync=k == 1)
        gs.finish()
        opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        equal_after_step.append(same_on_all_ranks(flat, w.group))
    gs.remove_hooks()
    return {"equal_after_step": equal_after_step, "params": params_json(model)}


def unused_on_some_ranks(w, make, options: dict) -> dict:
    """Only rank 0 uses the ``extra`` branch: the others have no gradient for it."""
    model = make()
    gs = GradSync(model, w.group, **options)
    x, y = make_data(0, w.world_size * MICRO_BATCH, w.device)
    out = model(part(x, w.rank), use_extra=w.rank == 0)
    gs.backward(F.cross_entropy(out, part(y, w.rank)))
    gs.finish()
    gs.remove_hooks()
    return {"grads": grads_json(model)}


def references(w, make) -> dict:
    """What the strategies must reproduce, made without them: one process on the whole batch
    (each check's global batch), and torch DDP."""
    n, ref = w.world_size, {}
    model = make()
    x, y = make_data(0, n * MICRO_BATCH, w.device)
    F.cross_entropy(model(x), y).backward()  # the mean over the whole global batch
    ref["one_step"] = grads_json(model)
    model = make()
    x, y = make_data(1, n * ACCUM_STEPS * MICRO_BATCH, w.device)
    F.cross_entropy(model(x), y).backward()
    ref["accumulation"] = grads_json(model)
    model = make()
    x, y = make_data(0, n * MICRO_BATCH, w.device)
    losses = [F.cross_entropy(model(part(x, r), use_extra=r == 0), part(y, r)) for r in range(n)]
    (sum(losses) / n).backward()  # each rank's loss, averaged as the ranks do
    ref["unused_on_some_ranks"] = grads_json(model)
    ref["training"] = reference_training(w, make)
    ddp = DDP(make(), device_ids=[w.device.index] if w.device.type == "cuda" else None,
              bucket_cap_mb=SMALL_BUCKET_MB, find_unused_parameters=True)
    F.cross_entropy(ddp(part(x, w.rank)), part(y, w.rank)).backward()
    ref["ddp"] = grads_json(ddp.module)
    return ref


def reference_training(w, make) -> dict:
    model = make()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9)
    for step in range(TRAIN_STEPS):
        x, y = make_data(2 + step, w.world_size * 2 * MICRO_BATCH, w.device)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return params_json(model)


def all_ranks(flag: bool, w) -> bool:
    """True when ``flag`` is true on every rank."""
    t = torch.tensor([int(flag)], device=w.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=w.group)
    return bool(t.item())


def broadcast_check(w) -> tuple[dict, dict]:
    """Differently initialised replicas (seed + rank) become rank 0's after the broadcast."""
    model = SmallNet().to(w.device)
    flat = lambda: torch.cat([t.detach().flatten() for t in model.state_dict().values()])
    rank0_before = flat().clone()
    equal_before = same_on_all_ranks(flat(), w.group)
    broadcast_parameters(model, w.group)
    dist.broadcast(rank0_before, src=0, group=w.group)  # what rank 0 had before
    report = {"equal_before": equal_before, "equal_after": same_on_all_ranks(flat(), w.group),
              "equal_to_rank0": all_ranks(torch.equal(flat(), rank0_before), w)}
    return report, copy.deepcopy(model.state_dict())


def token_loss_sum(model: nn.Module, batch) -> torch.Tensor:
    logits = model(batch.inputs)  # (batch, length, vocab)
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(),
                           ignore_index=IGNORE, reduction="sum")


def transformer_references(w, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the batch's mean token loss: one process, and torch DDP."""
    model = make_transformer(seed=0, device=w.device)
    token_loss_sum(model, batch).div(batch.num_targets).backward()  # the true mean
    single = flat_grads(model)
    model = make_transformer(seed=0, device=w.device)
    ddp = DDP(model, device_ids=[w.device.index] if w.device.type == "cuda" else None,
              bucket_cap_mb=TRANSFORMER_BUCKET_MB)
    mine = batch[w.rank * MICRO_BATCH:(w.rank + 1) * MICRO_BATCH]
    token_loss_sum(ddp, mine).mul(w.world_size / batch.num_targets).backward()
    return single, flat_grads(model)


def check_transformer(w, options: dict, batch, single, ddp) -> dict:
    """The tiny transformer on variable-length sums against one process and torch DDP."""
    model = make_transformer(seed=0, device=w.device)
    options = {**options, "bucket_mb": TRANSFORMER_BUCKET_MB}
    gs = GradSync(model, w.group, **options)
    mine = batch[w.rank * MICRO_BATCH:(w.rank + 1) * MICRO_BATCH]
    # the rank's token sum over ALL tokens, times N as the sync divides by N: the batch mean
    gs.backward(token_loss_sum(model, mine) * w.world_size / batch.num_targets)
    gs.finish()
    gs.remove_hooks()
    ours = flat_grads(model)
    report = {"equal_on_ranks": same_on_all_ranks(ours, w.group), "buckets": len(gs.buckets),
              "timeline": gs.timeline}
    for name, theirs in (("single", single), ("ddp", ddp)):
        report[f"rel_l2_{name}"] = float((ours - theirs).norm() / theirs.norm())
        report[f"allclose_{name}"] = torch.allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    return report


def main() -> None:
    labels = sys.argv[1].split(",") if len(sys.argv) > 1 else list(VARIANTS)
    unknown = sorted(set(labels) - set(VARIANTS))
    if unknown:
        sys.exit(f"unknown variants {unknown}; pick from {list(VARIANTS)}")
    with worker(seed=0) as w:
        report, state = broadcast_check(w)

        def make() -> SmallNet:
            model = SmallNet().to(w.device)
            model.load_state_dict(state)
            return model

        result = {"world_size": w.world_size, "micro_batch": MICRO_BATCH, "broadcast": report,
                  "reference": references(w, make), "variants": {}, "transformer": {}}
        batch = global_batch(seed=0, step=0, size=w.world_size * MICRO_BATCH).to(w.device)
        single, ddp = transformer_references(w, batch)
        for label in labels:
            options = VARIANTS[label]
            result["variants"][label] = {
                "options": options, "one_step": one_step(w, make, options),
                "accumulation": accumulation(w, make, options),
                "training": training(w, make, options),
                "unused_on_some_ranks": unused_on_some_ranks(w, make, options)}
            result["transformer"][label] = check_transformer(w, options, batch, single, ddp)
        print0(w, f"checked {len(labels)} variants on {w.world_size} ranks")
        save_result(result)


if __name__ == "__main__":
    main()
