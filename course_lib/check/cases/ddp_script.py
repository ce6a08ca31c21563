"""Exercise 9.3, a complete DDP training script: ``train(config)`` and ``main()`` in the
learner's file; ``train`` launched on 2, 3 and 4 processes, ``main`` read.

Rank side: each case builds the learner's ``Config`` (the checkpoint in the run's folder)
and calls ``train(config)`` on every rank, inside the checker's process group. Meanwhile
every ``DistributedDataParallel`` the learner builds gets a communication hook that does what
DDP does by default and counts the synchronising backward passes; every ``torch.save`` is
noted; ``dist.destroy_process_group()`` is refused (``main()`` ends the group). The answer
comes from one process: the same model and dataset, every rank's ``DistributedSampler``
indices of an optimizer step taken together as one big batch (and the same for known
mistakes, to name them: no ``set_epoch``, a loss not divided by the micro-steps, a loss
divided by the world size as well, a sampler left with its own seed). The hook's count names
steps whose gradients DDP never all-reduced (``no_sync`` on every micro-step); ``train``
returns the module inside DDP, not the wrapper.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

from course_lib.check.answers import close, describe
from course_lib.check.cases import flat_parameters
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import names_in_file

CONFIGS = (  # what each case changes in Config; every world size 2..4 gets whole steps
    {"epochs": 2, "dataset_size": 96, "micro_batch": 4, "accum_steps": 2, "lr": 0.1, "seed": 0},
    {"epochs": 3, "dataset_size": 72, "micro_batch": 2, "accum_steps": 3, "lr": 0.2, "seed": 5},
)
FIELDS = (*CONFIGS[0], "checkpoint")  # the fields Config must have
MISTAKES = {"no_set_epoch": {"set_epoch": False}, "loss_not_scaled": {"loss_scale": "k"},
            "loss_over_world": {"loss_scale": "1/n"},
            "sampler_seed": {"sampler_seed": 0}}  # known mistakes, as reference() runs


def case_specs(world_size: int, options: dict) -> list[dict]:
    return [{"name": f"{c['epochs']} epochs of {c['dataset_size']} examples, micro-batch "
                     f"{c['micro_batch']}, {c['accum_steps']} micro-steps per step",
             "config": c, "index": i} for i, c in enumerate(CONFIGS)]


def reference(learner, config, n: int, set_epoch: bool = True, loss_scale="1",
              sampler_seed: int | None = None) -> dict:
    """One process: each optimizer step on every rank's examples of that step at once (the
    samplers shuffled with ``sampler_seed``, else config.seed)."""
    scale = {"1": 1.0, "k": float(config.accum_steps), "1/n": 1 / n}[loss_scale]
    model, data = learner.make_model(config), learner.make_dataset(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    per_step, losses = config.micro_batch * config.accum_steps, []  # per rank per step
    for epoch in range(config.epochs):
        seed = config.seed if sampler_seed is None else sampler_seed
        samplers = [DistributedSampler(data, num_replicas=n, rank=r, shuffle=True, seed=seed)
                    for r in range(n)]
        for sampler in samplers if set_epoch else ():
            sampler.set_epoch(epoch)
        orders = [list(s) for s in samplers]
        for k in range(len(orders[0]) // per_step):
            x, y = data[[i for o in orders for i in o[k * per_step:(k + 1) * per_step]]]
            loss = F.cross_entropy(model(x), y)  # equal micro-batches: the mean of means
            optimizer.zero_grad()
            (loss * scale).backward()
            optimizer.step()
            losses.append(loss.item())
    return {"params": flat_parameters(model), "losses": losses}


@contextmanager
def watching_ddp(counts: dict, saves: list):
    """Count every DDP's synchronisations and forwards, note every torch.save, refuse ending
    the group."""
    real = DistributedDataParallel.__init__, torch.save, dist.destroy_process_group
    all_reduce = getattr(dist.all_reduce, "original", dist.all_reduce)  # not the tracer's

    def hook(state, bucket):  # what DDP does without a hook, counted
        group = state if state is not None else dist.group.WORLD
        counts["syncs"] += bucket.index() == 0  # bucket 0 once per synchronising backward
        tensor = bucket.buffer().div_(group.size())  # sum of g / N: the mean
        return all_reduce(tensor, group=group, async_op=True).get_future().then(
            lambda done: done.value()[0])

    def forward(ddp, args):  # the wrapper's forward ran: outside no_sync() it synchronises
        counts["forwards"] += 1
        counts["synced_forwards"] += ddp.require_backward_grad_sync

    def init(ddp, *args, **kwargs):
        real[0](ddp, *args, **kwargs)
        counts["models"] += 1
        ddp.register_comm_hook(ddp.process_group, hook)
        ddp.register_forward_pre_hook(forward)

    def save(obj, f, *args, **kwargs):
        saves.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else "a file object")
        return real[1](obj, f, *args, **kwargs)

    def destroy(*args, **kwargs):
        raise RuntimeError("train(config) called dist.destroy_process_group(): the group "
                           "belongs to whoever started it; end it in main(), after train")

    DistributedDataParallel.__init__, torch.save, dist.destroy_process_group = init, save, destroy
    try:
        yield
    finally:
        DistributedDataParallel.__init__, torch.save, dist.destroy_process_group = real


def returned(result) -> dict:
    """What train returned, or what was wrong with it."""
    if not isinstance(result, dict) or "model" not in result or "losses" not in result:
        return {"ok": False, "what": describe(result)}
    model, losses = result["model"], result["losses"]
    if isinstance(model, DistributedDataParallel):
        return {"ok": False, "wrapper": True}
    if not isinstance(model, nn.Module) or not isinstance(losses, (list, tuple)):
        return {"ok": False, "what": f"model: {describe(model)}, losses: {describe(losses)}"}
    numbers = [float(v) for v in losses if isinstance(v, (int, float)) or (
        torch.is_tensor(v) and v.numel() == 1)]
    if len(numbers) != len(losses):
        return {"ok": False, "what": f"losses: {describe(losses)}"}
    return {"ok": True, "params": flat_parameters(model), "losses": numbers}


def checkpoint_state(path: str) -> dict:
    """Does the file hold a state_dict of the model without DDP?"""
    if not os.path.isfile(path):
        return {"found": False}
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # a pickled module or optimizer, say: not tensors by name
        return {"found": True, "state_dict": False}
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        return {"found": True, "state_dict": False}
    return {"found": True, "state_dict": True,
            "ddp_keys": any(k.startswith("module.") for k in state),
            "params": torch.cat([v.reshape(-1).float() for v in state.values()]).tolist()}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    path = os.path.join(options["run_dir"], f"checkpoint-{spec['index']}.pt")  # removed after
    config = learner.Config(**{**spec["config"], "checkpoint": path})
    if dataclasses.is_dataclass(config):
        config = dataclasses.replace(config)  # the learner's train may not change ours
    right = reference(learner, config, n)
    mistakes = {name: reference(learner, config, n, **how)["params"]
                for name, how in MISTAKES.items()
                if how.get("sampler_seed") != config.seed}  # the seed 0 of a Config(seed=0)
    counts, saves = {"syncs": 0, "models": 0, "forwards": 0, "synced_forwards": 0}, []
    with tracer.watching(spec["name"], range(n)) as log, watching_ddp(counts, saves):
        result = learner.train(config)
    tracer.barrier()  # every rank done, the file complete, before rank 0 reads it
    return {"returned": returned(result), "expected": right, "mistakes": mistakes, **counts,
            "steps": len(right["losses"]), "accum_steps": config.accum_steps, "saves": saves,
            "loss_values": sum(k for call, _, k in log.handed if call == "all_reduce"),
            "checkpoint": checkpoint_state(path) if rank == 0 else {}}


# ---- the judge (in the kernel) --------------------------------------------------------------

WEIGHT_MISTAKES = {  # what each known mistake's weights mean
    "no_set_epoch": "every epoch saw its examples in the same order: DistributedSampler "
                    "shuffles with seed + epoch, and the epoch is yours to tell it each epoch",
    "loss_not_scaled": "each step's gradient is accum_steps times too large: a micro-step's "
                       "loss is a mean, and accum_steps backward passes add up accum_steps "
                       "means, where the step needs their mean",
    "loss_over_world": "each step's gradient is world_size times too small: DDP already "
                       "averages over the ranks (it divides their sum by world_size), so "
                       "dividing the loss by world_size divides twice",
    "sampler_seed": "the examples were shuffled with DistributedSampler's own seed, 0, not "
                    "config.seed: give the sampler the config's seed (the same on every rank)",
}


def near(a, b) -> bool:
    return close(a, b, 1e-4, 1e-5)


def judge_saves(rank: int, s: dict) -> None:
    expect(rank == 0 or not s["saves"], f"rank {rank} wrote the checkpoint too: every rank "
                                        "writes the same file at once, which can leave it "
                                        "damaged, and one copy is enough (the replicas are "
                                        "equal)")
    c = s["checkpoint"]
    if rank != 0:
        return
    expect(s["saves"] and c.get("found"), "rank 0 wrote no checkpoint at config.checkpoint: "
                                          "the file was not there when train returned")
    expect(c.get("state_dict"), "the checkpoint is not a state_dict (the tensors by name): a "
                                "whole module or another object does not load into a fresh "
                                "model with load_state_dict")
    expect(not c.get("ddp_keys"), "the checkpoint's names start with 'module.': that is the "
                                  "DDP wrapper's state_dict, which does not load into a model "
                                  "without DDP; the model inside the wrapper has plain names")
    expect(near(c["params"], s["returned"]["params"]),
           "the checkpoint does not hold the final weights: it was written before the last "
           "optimizer step")


def judge_rank(rank: int, s: dict, n: int) -> None:
    got = s["returned"]
    expect(not got.get("wrapper"), "train(config) returned the DistributedDataParallel wrapper "
                                   "as \"model\": return the trained module inside it, "
                                   "model.module, which runs and loads without DDP")
    expect(got["ok"], "train(config) must return {\"model\": the trained module, \"losses\": "
                      f"[one number per optimizer step]}}; it returned {got.get('what')}")
    expect(s["models"] > 0, "train(config) never wrapped the model in DistributedDataParallel: "
                            "DDP averages the gradients")
    judge_too_few_syncs(s)
    share = s["steps"] * s["accum_steps"]  # the micro-steps this rank's 1/N of the data gives
    expect(n == 1 or s["forwards"] != n * share,
           f"rank {rank} ran {s['forwards']} micro-steps, {n} times the {share} its share of "
           "the data gives: each rank went through the whole dataset. A DistributedSampler "
           "(num_replicas=world_size, rank=rank) hands each rank its own 1/N of the examples")
    if not near(got["params"], s["expected"]["params"]):
        for mistake, hint in WEIGHT_MISTAKES.items():
            expect(mistake not in s["mistakes"] or not near(got["params"], s["mistakes"][mistake]),
                   hint)
        expect(False, f"rank {rank}'s final weights differ from one process trained on every "
                      "rank's micro-batches of each step at once: each optimizer step must use "
                      "the mean gradient of the step's micro-batches on every rank (look at "
                      "the loss's scale, and at when the optimizer steps and zeroes)")
    judge_saves(rank, s)
    expect(len(got["losses"]) == s["steps"], f"rank {rank} logged {len(got['losses'])} losses "
                                             f"for {s['steps']} optimizer steps: log one per "
                                             "optimizer step")


def judge_too_few_syncs(s: dict) -> None:
    """Every optimizer step's gradients all-reduced by DDP at least once."""
    syncs, steps = s["syncs"], s["steps"]
    if syncs >= steps:
        return
    if not s["forwards"]:
        why = ("the DDP wrapper's forward never ran: the micro-steps called the model itself, "
               "model(x), where ddp(x) is what tells DDP a backward follows")
    elif not s["synced_forwards"]:
        why = "no_sync() covered every micro-step, the last one of each step too"
    else:
        why = ("some steps' last micro-step ran inside no_sync() or without the DDP "
               "wrapper's forward")
    expect(False, f"DDP all-reduced the gradients {syncs} times for {steps} optimizer steps: "
                  f"{why}, so the ranks stepped with gradients never averaged. The micro-step "
                  "that ends an optimizer step must run, forward and backward, through the "
                  "wrapper and outside no_sync()")


def judge_syncs(s: dict, text: str) -> None:
    if s["syncs"] <= s["steps"]:
        return
    if s["syncs"] >= s["steps"] * s["accum_steps"] and "no_sync" in text:
        expect(False, f"DDP all-reduced the gradients {s['syncs']} times for {s['steps']} "
                      "optimizer steps: no_sync() wraps the backward only, but DDP decides "
                      "during the FORWARD whether the next backward synchronises")
    expect(False, f"DDP all-reduced the gradients {s['syncs']} times for {s['steps']} "
                  "optimizer steps: micro-steps that do not end a step synchronised too, "
                  "though only the last one's backward needs to (.grad adds up locally)")


def judge_losses(by_rank: dict, n: int, k: int) -> None:
    losses = [by_rank[r]["returned"]["losses"] for r in range(n)]
    differ = next((r for r in range(1, n) if not near(losses[r], losses[0])), None)
    expect(differ is None, f"rank 0 and rank {differ} logged different losses: each logged "
                           "the loss of its own micro-batches, not the mean over the global "
                           "batch, which is the same number on every rank")
    right = by_rank[0]["expected"]["losses"]
    causes = {n: ["they are the sum over the ranks, not their mean"]}
    causes.setdefault(k, []).append("each micro-step's loss was added as it is, not divided "
                                    "by the number of micro-steps")
    for factor, why in causes.items():
        expect(factor == 1 or not near(losses[0], [v * factor for v in right]),
               f"the logged losses are {factor} times too large: "
               + (f"either {why[0]}, or {why[1]}" if len(why) > 1 else why[0]))
    expect(near(losses[0], right), "the logged losses are not the mean loss of each step's "
                                   "global batch: every micro-step's loss of every rank must "
                                   "count once, with the same weight")
    sent, steps = by_rank[0]["loss_values"], by_rank[0]["steps"]
    expect(sent <= steps, f"rank 0 all-reduced {sent} loss values for {steps} optimizer steps: "
                          "one number per step is all the log needs")


def judge(spec: dict, by_rank: dict, run) -> None:
    with open(run.path, encoding="utf-8") as f:
        text = f.read()
    for rank in range(len(by_rank)):
        judge_rank(rank, by_rank[rank], len(by_rank))
    judge_syncs(by_rank[0], text)
    judge_losses(by_rank, len(by_rank), by_rank[0]["accum_steps"])


MAIN_STEPS = (("init_process_group", "start the process group (train expects one started)"),
              ("train", "call train with a Config"),
              ("destroy_process_group", "end the process group once train has returned"))


def before_launch(path: str) -> None:
    """Read, not launched: Config's fields, and main() starting, training and ending."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    config = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config"),
                  None)
    expect(config is not None, f"{path} defines no class Config: keep the @dataclass Config "
                               "the exercise gives, at the top level of the file")
    fields = {n.target.id for n in config.body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    missing = [f for f in FIELDS if f not in fields]
    expect(not missing, f"Config has no field {(missing or [''])[0]}: keep the fields the "
                        "exercise gives (the checker sets them)")
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    if "NotImplementedError" in ast.unparse(main):
        raise NotImplementedError("main() is still open")
    used = {full.rsplit(".", 1)[-1] for full, _, _ in names_in_file(path, ("main",))}
    for name, what in MAIN_STEPS:
        expect(name in used, f"main() does not {what}: torchrun runs main() on every rank "
                             "(the checker calls train itself, so only main() lacks it)")


def explain(error: dict, text: str) -> str:
    if "initialize the default process group twice" in error["message"]:
        return ("train(config) runs in a process group that is already started (by main(), "
                "or by the checker), so starting one inside train fails: that is main()'s "
                "job.")
    return ""


SAME = "Every rank must make the same collective calls in the same order."
EXERCISE = FileExercise(
    "9.3", "workspace/my_ddp_train.py", ("train", "main"), __name__,
    Advice(all_send=SAME, all_recv=SAME, mismatch=SAME, size=SAME), judge,
    library=dict.fromkeys(("course_lib.train", "course_lib.demos"), "that is the course's own "
                          "trainer: write train yourself, with DistributedDataParallel"),
    explain=explain, before_launch=before_launch, deadline_s=60.0,
    entry="check.nb09.my_ddp_train")

