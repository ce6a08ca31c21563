"""Our data-parallel wrappers and ZeRO-1 against torch DDP and one process, launched by
tests/test_data_parallel.py (one launch per world size, any world size).

Every loop here calls ``loss.backward()`` itself, as a learner's loop does. The model has a
tied weight (one parameter used by two layers), a frozen layer, a buffer, a layer no rank
uses and a branch only rank 0 uses. Rank 0 hands back, per variant: the parameters after
training, the last gradients (None kept as None), whether the replicas were bitwise equal
after every step, how many torch.distributed calls ran inside ``no_sync()``, the all-reduces
and bytes the recorder counted, and the timeline of one step of the tiny transformer.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.core.train_step import finish_sync, train_step
from course_lib.core.zero import Zero1
from course_lib.lessons.memory import optimizer_state_bytes
from course_lib.runtime.launch import save_result
from course_lib.runtime.worker import worker
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import make_transformer
from course_lib.tasks.sequences import global_batch
from course_lib.train.syncs import wrap_model

MICRO, ACCUM, STEPS = 4, 2, 3  # examples per micro-step, micro-steps per step, steps
SMALL_MB = 0.0005  # about 500 bytes: several buckets even for this tiny model
VARIANTS = {  # label: (sync name, bucket_mb, find_unused_parameters)
    "naive": ("naive", None, False), "ring": ("ring", None, False),
    "allreduce": ("allreduce", None, True),
    "bucketed": ("bucketed", SMALL_MB, False), "bucketed one bucket": ("bucketed", None, True),
    "bucketed one per parameter": ("bucketed", 1e-9, False),
    "overlap": ("overlap", SMALL_MB, False), "overlap find_unused": ("overlap", SMALL_MB, True),
    "overlap one bucket": ("overlap", None, False),
}
WATCHED = ("all_reduce", "broadcast", "send", "recv", "isend", "irecv", "batch_isend_irecv",
           "all_gather", "reduce_scatter", "all_gather_object")


class SmallNet(nn.Module):
    """Tied, frozen, unused and rank-0-only parameters, and a buffer. Small for test speed."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Linear(6, 12), nn.LayerNorm(12)
        self.proj_in, self.proj_out = nn.Linear(12, 12), nn.Linear(12, 12)
        self.proj_out.weight = self.proj_in.weight  # tied: one parameter, two layers
        self.frozen = nn.Linear(12, 12).requires_grad_(False)
        self.extra, self.head, self.unused = nn.Linear(12, 12), nn.Linear(12, 3), nn.Linear(4, 4)
        self.register_buffer("scale", torch.rand(3) + 0.5)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = torch.tanh(self.proj_in(self.norm(self.embed(x))))  # (batch, 12)
        h = self.proj_out(h) + self.frozen(h)
        if use_extra:
            h = h + self.extra(h)
        return self.head(h) * self.scale  # (batch, 3)


def data(step: int, n: int, device):
    """The step's global batch, the same on every rank: x (n, 6), y (n,)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 6, generator=g).to(device), torch.randint(0, 3, (n,), generator=g).to(
        device)


def rows(rank: int, k: int) -> slice:
    """Micro-step k of ``rank``: rank r owns block r of the global batch, K parts in turn."""
    start = (rank * ACCUM + k) * MICRO
    return slice(start, start + MICRO)


@contextmanager
def counting(counts: dict):
    """Count calls of torch.distributed's communication functions while inside."""
    saved = {name: getattr(dist, name) for name in WATCHED}

    def counted(name, fn):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call

    for name, fn in saved.items():
        setattr(dist, name, counted(name, fn))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def bits(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_everywhere(flat: torch.Tensor, group) -> bool:
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, flat.contiguous(), group=group)
    return all(torch.equal(copies[0], c) for c in copies)


def as_json(model: nn.Module, what: str) -> dict:
    get = (lambda p: p.detach()) if what == "params" else (lambda p: p.grad)
    return {n: None if get(p) is None else get(p).reshape(-1).tolist()
            for n, p in model.named_parameters()}


def train(w, model, module, opt) -> dict:
    """STEPS steps of ACCUM micro-steps; only the last one syncs. Rank 0 uses ``extra``."""
    equal, quiet = [], {}
    for step in range(STEPS):
        x, y = data(step, w.world_size * ACCUM * MICRO, w.device)
        opt.zero_grad(set_to_none=True)
        for k in range(ACCUM):
            last = k == ACCUM - 1
            with nullcontext() if last else model.no_sync(), \
                    nullcontext() if last else counting(quiet):
                out = model(x[rows(w.rank, k)], use_extra=w.rank == 0)
                (F.cross_entropy(out, y[rows(w.rank, k)]) / ACCUM).backward()
        finish_sync(model)
        grads = as_json(module, "grads")
        opt.step()
        equal.append(same_everywhere(bits(module), w.group))
    return {"params": as_json(module, "params"), "grads": grads, "equal_after_step": equal,
            "calls_inside_no_sync": sum(quiet.values())}


def one_process(w, make) -> dict:
    """The reference: one process, the whole global batch, rank r's rows as rank r uses them."""
    module = make()
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = data(step, w.world_size * ACCUM * MICRO, w.device)
        opt.zero_grad(set_to_none=True)
        n = w.world_size * ACCUM
        for r in range(w.world_size):
            for k in range(ACCUM):
                out = module(x[rows(r, k)], use_extra=r == 0)
                (F.cross_entropy(out, y[rows(r, k)]) / n).backward()
        grads = as_json(module, "grads")
        opt.step()
    return {"params": as_json(module, "params"), "grads": grads}


def run_variant(w, make, name: str, bucket_mb, find_unused: bool) -> dict:
    module = make()
    model = wrap_model(name, module, w.group, w.device, bucket_mb, find_unused)
    result = train(w, model, module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9))
    recorder = getattr(model, "recorder", None)
    result["all_reduces"] = recorder.calls if recorder else None
    result["bytes_reduced"] = recorder.bytes if recorder else None
    result["buckets"] = [[n for n, p in module.named_parameters() if any(p is q for q in b.params)]
                         for b in getattr(model, "buckets", [])]
    return result


def transformer_step(w, name: str) -> dict:
    """One step of the trainer's own train_step on variable-length sums: its gradients."""
    model = wrap_model(name, make_transformer(seed=0, device=w.device), w.group, w.device, 0.01)
    batch = global_batch(seed=0, step=0, size=w.world_size * ACCUM * MICRO)
    parts = [p.to(w.device) for p in micro_batches_of_rank(batch, w.rank, w.world_size, ACCUM)]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradients are the point
    record = train_step(model, opt, parts, w.group)
    flat = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
    return {"loss": record["loss"], "grad": flat.tolist(),
            "equal_on_ranks": same_everywhere(flat, w.group)}


def timeline(w, name: str) -> list[dict]:
    """One synced backward of the tiny transformer, timed by the wrapper's recorder."""
    model = wrap_model(name, make_transformer(seed=0, device=w.device), w.group, w.device, 0.01)
    batch = global_batch(seed=0, step=0, size=w.world_size * MICRO)
    mine = micro_batches_of_rank(batch, w.rank, w.world_size, 1)[0].to(w.device)
    model.recorder.start_step()
    loss = F.cross_entropy(model(mine.inputs).flatten(0, 1), mine.targets.flatten(),
                           ignore_index=-100)
    with model.recorder.compute("backward"):
        loss.backward()
    model.finish_gradient_sync()
    model.recorder.settle()
    return model.recorder.events


def zero_check(w, make) -> dict:
    """ZeRO-1 against DDP + AdamW (weight decay, clipping): parameters and state per rank."""
    results = {}
    for kind in ("plain", "zero"):
        module = make()  # the same weights on every rank already
        if kind == "plain":
            model = wrap_model("ddp", module, w.group, w.device, SMALL_MB, True)
            opt = torch.optim.AdamW(module.parameters(), lr=0.01, weight_decay=0.1)
        else:
            model = module  # no wrapper: ZeRO-1's step does the communication
            opt = Zero1(module.parameters(), torch.optim.AdamW, w.group, max_grad_norm=0.5,
                        lr=0.01, weight_decay=0.1)
        mine = slice(w.rank * MICRO, (w.rank + 1) * MICRO)
        for step in range(STEPS):
            x, y = data(step, w.world_size * MICRO, w.device)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[mine], use_extra=w.rank == 0), y[mine]).backward()
            if kind == "plain":
                torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
            opt.step()
        state = opt.inner if kind == "zero" else opt
        results[kind] = {"params": as_json(module, "params"),
                         "state_bytes": optimizer_state_bytes(state),
                         "equal_on_ranks": same_everywhere(bits(module), w.group)}
    everyone = [None] * w.world_size
    dist.all_gather_object(everyone, results["zero"]["state_bytes"], group=w.group)
    results["zero"]["state_bytes_per_rank"] = everyone
    return results


def main() -> None:
    with worker(seed=0) as w:
        torch.manual_seed(0)  # the same start on every rank, then broadcast anyway
        state = SmallNet().to(w.device).state_dict()

        def make() -> SmallNet:
            module = SmallNet().to(w.device)
            module.load_state_dict(state)
            return module

        result = {"world_size": w.world_size, "reference": one_process(w, make), "variants": {},
                  "transformer": {}}
        ddp = wrap_model("ddp", make(), w.group, w.device, SMALL_MB, True)
        result["ddp"] = train(w, ddp, ddp.module, torch.optim.SGD(ddp.module.parameters(),
                                                                  lr=0.1, momentum=0.9))
        for label, (name, bucket_mb, find_unused) in VARIANTS.items():
            result["variants"][label] = run_variant(w, make, name, bucket_mb, find_unused)
        for name in ("ddp", "naive", "ring", "bucketed", "overlap"):
            result["transformer"][name] = transformer_step(w, name)
        result["timelines"] = {name: timeline(w, name) for name in ("ring", "bucketed",
                                                                        "overlap")}
        result["zero"] = zero_check(w, make)
        save_result(result)


if __name__ == "__main__":
    main()
