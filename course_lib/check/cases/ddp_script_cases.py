"""A complete DDP training script: the cases of exercise 9.3, run by
``course_lib.check.mp.program``.

Each case builds the learner's ``Config`` (fields as the exercise hands them out, the
checkpoint in a folder the checker made) and calls ``train(config)`` on every rank, inside the
checker's process group. While it runs, the case

- registers on every ``DistributedDataParallel`` the learner builds a communication hook that
  does what DDP does by default and counts the synchronising backward passes;
- notes every ``torch.save`` (which rank, which path);
- refuses ``dist.destroy_process_group()`` (``main()`` ends the group, not ``train``).

The checker's own answer comes from one process: the same model and dataset, every rank's
``DistributedSampler`` indices of an optimizer step taken together as one big batch (and the
same again for known mistakes, to name them: no ``set_epoch``, a loss not divided by the
micro-steps, a loss divided by the world size as well).
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from course_lib.check.answers import describe
from course_lib.check.mp.tracer import Tracer

CONFIGS = (  # what each case changes in Config; every world size 2..4 gets whole steps
    {"epochs": 2, "dataset_size": 96, "micro_batch": 4, "accum_steps": 2, "lr": 0.1,
     "seed": 0},
    {"epochs": 3, "dataset_size": 72, "micro_batch": 2, "accum_steps": 3, "lr": 0.2,
     "seed": 5},
)
FIELDS = tuple(CONFIGS[0]) + ("checkpoint",)  # the fields Config must have


class GroupEnded(RuntimeError):
    """The learner's train() tried to end the process group."""


def case_specs(world_size: int, options: dict) -> list[dict]:
    return [{"name": f"{c['epochs']} epochs of {c['dataset_size']} examples, micro-batch "
                     f"{c['micro_batch']}, {c['accum_steps']} micro-steps per step",
             "config": c, "index": i, "ranks": world_size} for i, c in enumerate(CONFIGS)]


def flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).tolist()


def reference(learner, config, world_size: int, set_epoch: bool = True,
              loss_scale: float = 1.0) -> dict:
    """One process: each optimizer step on every rank's examples of that step at once. A
    known mistake's result: without ``set_epoch``, or the loss times ``loss_scale``."""
    model, data = learner.make_model(config), learner.make_dataset(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    per_step = config.micro_batch * config.accum_steps  # examples per rank per step
    losses = []
    for epoch in range(config.epochs):
        orders = []
        for rank in range(world_size):
            sampler = DistributedSampler(data, num_replicas=world_size, rank=rank,
                                         shuffle=True, seed=config.seed)
            if set_epoch:
                sampler.set_epoch(epoch)
            orders.append(list(sampler))
        for k in range(len(orders[0]) // per_step):
            rows = [i for order in orders for i in order[k * per_step:(k + 1) * per_step]]
            x, y = data[rows]  # (world_size x per_step, 2), (world_size x per_step,)
            loss = F.cross_entropy(model(x), y)  # equal micro-batches: the mean of their means
            optimizer.zero_grad()
            (loss * loss_scale).backward()
            optimizer.step()
            losses.append(loss.item())
    return {"params": flat(model), "losses": losses}


class SyncCounter:
    """A DDP communication hook that averages each bucket as DDP does, and counts."""

    def __init__(self):
        self.models, self.syncs, self.buckets = 0, 0, 0

    def hook(self, ddp: DistributedDataParallel):
        group = ddp.process_group
        all_reduce = getattr(dist.all_reduce, "original", dist.all_reduce)  # not the tracer's

        def average(state, bucket):
            self.buckets += 1
            self.syncs += bucket.index() == 0  # bucket 0 comes once per synchronising backward
            tensor = bucket.buffer().div_(dist.get_world_size(group))  # sum of g / N: the mean
            work = all_reduce(tensor, group=group, async_op=True)
            return work.get_future().then(lambda done: done.value()[0])

        return average


@contextmanager
def watching_ddp_and_saves(counter: SyncCounter, saves: list):
    """Count every DDP's synchronisations, note every torch.save, refuse ending the group."""
    real_init, real_save, real_destroy = (DistributedDataParallel.__init__, torch.save,
                                          dist.destroy_process_group)

    def init(ddp, *args, **kwargs):
        real_init(ddp, *args, **kwargs)
        counter.models += 1
        ddp.register_comm_hook(None, counter.hook(ddp))

    def save(obj, f, *args, **kwargs):
        saves.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else "a file object")
        return real_save(obj, f, *args, **kwargs)

    def destroy(*args, **kwargs):
        raise GroupEnded("train(config) called dist.destroy_process_group(): the group "
                         "belongs to whoever started it; end it in main(), after train")

    DistributedDataParallel.__init__, torch.save, dist.destroy_process_group = (init, save,
                                                                                destroy)
    try:
        yield
    finally:
        DistributedDataParallel.__init__, torch.save = real_init, real_save
        dist.destroy_process_group = real_destroy


def returned(result) -> dict:
    """What train returned, or what was wrong with it."""
    if not isinstance(result, dict) or "model" not in result or "losses" not in result:
        return {"ok": False, "what": describe(result)}
    model, losses = result["model"], result["losses"]
    if isinstance(model, DistributedDataParallel):
        model = model.module
    if not isinstance(model, nn.Module) or not isinstance(losses, (list, tuple)):
        return {"ok": False, "what": f"model: {describe(model)}, losses: {describe(losses)}"}
    numbers = [float(v) for v in losses if isinstance(v, (int, float)) or (
        torch.is_tensor(v) and v.numel() == 1)]
    if len(numbers) != len(losses):
        return {"ok": False, "what": f"losses: {describe(losses)}"}
    return {"ok": True, "params": flat(model), "losses": numbers}


def checkpoint_state(path: str, rank: int) -> dict:
    """Rank 0, after train: does the file hold a state_dict of the model without DDP?"""
    if rank != 0:
        return {}
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # a missing or unreadable file is one answer
        return {"found": False}
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        return {"found": True, "state_dict": False}
    return {"found": True, "state_dict": True,
            "ddp_keys": any(k.startswith("module.") for k in state),
            "params": torch.cat([v.reshape(-1).float() for v in state.values()]).tolist()}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    path = os.path.join(options["folder"], f"checkpoint-{n}-{spec['index']}.pt")
    config = learner.Config(**{**spec["config"], "checkpoint": path})
    if dataclasses.is_dataclass(config):
        config = dataclasses.replace(config)  # the learner's train may not change ours
    right = reference(learner, config, n)
    counter, saves = SyncCounter(), []
    with tracer.watching(spec["name"], range(n)), watching_ddp_and_saves(counter, saves):
        result = learner.train(config)
    dist.barrier(group=group)  # every rank done, the file complete, before rank 0 reads it
    got = returned(result)
    expected_steps = len(right["losses"])
    mistakes = {"no_set_epoch": reference(learner, config, n, set_epoch=False)["params"],
                "loss_not_scaled": reference(learner, config, n,
                                             loss_scale=config.accum_steps)["params"],
                "loss_over_world": reference(learner, config, n, loss_scale=1 / n)["params"]}
    return {"name": spec["name"], "ranks": n, "returned": got, "expected": right,
            "mistakes": mistakes,
            "ddp_models": counter.models, "syncs": counter.syncs, "steps": expected_steps,
            "accum_steps": config.accum_steps, "saves": saves,
            "checkpoint": checkpoint_state(path, rank)}
