"""Our data-parallel wrappers and ZeRO-1 against torch DDP and one process, launched by
tests/test_data_parallel.py (one launch per world size, any world size).

Every loop here calls ``loss.backward()`` itself, as a learner's loop does. The model has a
tied weight (one parameter used by two layers), a frozen layer, a buffer, a layer no rank
uses and a branch only rank 0 uses. Rank 0 hands back, per variant: the parameters after
training, the last gradients (None kept as None), whether the replicas were bitwise equal
after every step, how many torch.distributed calls ran inside ``no_sync()``, the all-reduces
and bytes the recorder counted, and the timeline of one step of the tiny transformer. Also:
every wrapper with ``find_unused_parameters=True`` against DDP on a model that returns a
nested dict, the torch.distributed calls of one ZeRO-1 step, and the error every rank gets
when the ranks wrap different models.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.core.buckets import BucketedDataParallel
from course_lib.core.collectives import ByteCounter
from course_lib.core.data_parallel import AllReducePerParameter
from course_lib.core.overlap import OverlapDataParallel
from course_lib.core.train_step import finish_sync, train_step
from course_lib.core.zero import Zero1
from course_lib.lessons.memory import optimizer_state_bytes
from course_lib.lessons.timeline import CommRecorder
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
# isend and irecv left out: P2POp accepts only the real ones, and batch_isend_irecv counts them
RING_WATCHED = tuple(name for name in WATCHED if name not in ("isend", "irecv"))


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
def counting(counts: dict, watched=WATCHED, calls: list | None = None):
    """Count calls of torch.distributed's communication functions while inside; ``calls``
    also gets (name, dtype, numel) of each call's first tensor."""
    saved = {name: getattr(dist, name) for name in watched}

    def counted(name, fn):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            if calls is not None and args and torch.is_tensor(args[0]):
                calls.append([name, str(args[0].dtype).removeprefix("torch."), args[0].numel()])
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
    model = wrap_model(name, make_transformer(seed=0, device=w.device), w.group, w.device, 0.01,
                       recorder=CommRecorder)
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
            model, counter = module, ByteCounter()  # no wrapper: ZeRO-1's step communicates
            opt = Zero1(module.parameters(), torch.optim.AdamW, process_group=w.group,
                        max_grad_norm=0.5, counter=counter, lr=0.01, weight_decay=0.1)
        mine = slice(w.rank * MICRO, (w.rank + 1) * MICRO)
        counts, calls = {}, []  # every torch.distributed call of ZeRO-1's steps
        for step in range(STEPS):
            x, y = data(step, w.world_size * MICRO, w.device)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[mine], use_extra=w.rank == 0), y[mine]).backward()
            if kind == "plain":
                torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
                opt.step()
            else:
                with counting(counts, RING_WATCHED, calls):
                    opt.step()
        state = opt.inner if kind == "zero" else opt
        results[kind] = {"params": as_json(module, "params"),
                         "state_bytes": optimizer_state_bytes(state),
                         "equal_on_ranks": same_everywhere(bits(module), w.group)}
    results["zero"].update(steps=STEPS, calls=counts, all_reduces=[c for c in calls
                                                                   if c[0] == "all_reduce"],
                           ring_bytes=counter.bytes_sent)
    for key in ("state_bytes", "ring_bytes"):
        everyone = [None] * w.world_size
        dist.all_gather_object(everyone, results["zero"][key], group=w.group)
        results["zero"][f"{key}_per_rank"] = everyone
    return results


class DictNet(nn.Module):
    """Returns a dict with a nested tuple and list; ``unused`` never runs. Small for speed."""

    def __init__(self):
        super().__init__()
        self.trunk, self.head, self.aux = nn.Linear(6, 8), nn.Linear(8, 3), nn.Linear(8, 3)
        self.unused = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict:
        h = torch.tanh(self.trunk(x))  # (batch, 8)
        return {"logits": self.head(h), "extra": (0, [self.aux(h)])}


WRAPPERS = {"allreduce": AllReducePerParameter, "bucketed": BucketedDataParallel,
            "overlap": OverlapDataParallel}


def dict_output_check(w) -> dict:
    """DDP and each wrapper, built with the same keywords (process_group=, bucket_cap_mb=,
    find_unused_parameters=True): two steps on a dict output; the gradients and parameters."""
    torch.manual_seed(1)
    state = DictNet().to(w.device).state_dict()
    results = {}
    for name in ("ddp", *WRAPPERS):
        module = DictNet().to(w.device)
        module.load_state_dict(state)
        options = {"process_group": w.group, "find_unused_parameters": True}
        if name == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(module, bucket_cap_mb=SMALL_MB,
                                                              **options)
        elif name == "allreduce":
            model = WRAPPERS[name](module, **options)
        else:
            model = WRAPPERS[name](module, bucket_cap_mb=SMALL_MB, **options)
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        for step in range(2):
            x, y = data(step, w.world_size * MICRO, w.device)
            mine = slice(w.rank * MICRO, (w.rank + 1) * MICRO)
            opt.zero_grad(set_to_none=True)
            out = model(x[mine])
            loss = F.cross_entropy(out["logits"], y[mine]) + out["extra"][1][0].square().mean()
            loss.backward()
            finish_sync(model)
            grads = as_json(module, "grads")
            opt.step()
        results[name] = {"grads": grads, "params": as_json(module, "params")}
    return results


def different_models_check(w) -> str:
    """The last rank wraps a layer of another shape: every rank must raise ValueError."""
    shape = (3, 2) if w.rank == w.world_size - 1 else (2, 3)
    try:
        AllReducePerParameter(nn.Linear(*shape).to(w.device), process_group=w.group)
    except ValueError as e:
        message = str(e)
    else:
        message = ""
    healthy = torch.ones(1, device=w.device)
    dist.all_reduce(healthy, group=w.group)  # the group still works afterwards
    return message if int(healthy) == w.world_size else "the group broke"


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
        result["dict_output"] = dict_output_check(w)
        if w.world_size > 1:  # one rank cannot disagree with itself
            messages = [None] * w.world_size
            dist.all_gather_object(messages, different_models_check(w), group=w.group)
            result["different_models"] = messages
        save_result(result)


if __name__ == "__main__":
    main()
