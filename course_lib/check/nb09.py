"""Checkers for the exercises of notebook 09 (DDP in practice)."""

from __future__ import annotations

import ast
import io
import numbers
import os
import shutil
import tempfile

import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib.check.answers import call, describe, expect_function, expect_path
from course_lib.check.cases import ddp_script_cases
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.verdict import Advice
from course_lib.check.own_work import names_used
from course_lib.runtime.workspace import record_pass

SAMPLER_CASES = ((10, 2), (10, 3), (7, 4), (16, 4))  # (dataset size, world size)


def reference_indices(size: int, world_size: int, rank: int, epoch: int, seed: int) -> list:
    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


@exercise("9.1")
def sampler_by_hand(indices) -> None:
    """``indices(size, world_size, rank, epoch, seed)``: what DistributedSampler gives."""
    expect_function(indices, "check.nb09.sampler_by_hand(sampler_indices)")
    used = names_used(indices, ("DistributedSampler", "sampler_orders"))
    expect(not used, f"your function uses {(used or [''])[0]}: the point is to write what it "
                     "does yourself, with torch.randperm and a slice")
    for size, world_size in SAMPLER_CASES:
        for epoch in (0, 1):
            for rank in range(world_size):
                got = call(indices, size, world_size, rank, epoch, 0)
                if torch.is_tensor(got):
                    got = got.tolist()  # a tensor of indices counts as its list
                expect(isinstance(got, (list, tuple)) and all(
                    isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in got),
                       f"return this rank's indices as a list of whole numbers; your code "
                       f"returned {describe(got)}")
                got = [int(i) for i in got]
                want = reference_indices(size, world_size, rank, epoch, 0)
                if got == want:
                    continue
                per_rank = -(-size // world_size)
                expect(len(got) == per_rank,
                       f"{size} examples on {world_size} ranks: every rank gets "
                       f"ceil({size}/{world_size}) = {per_rank} indices (the permutation is "
                       f"padded by repeating its first indices), not {len(got)}")
                expect(epoch == 0 or got != reference_indices(size, world_size, rank, 0, 0),
                       "epoch 1 gives the same order as epoch 0: the shuffle's seed must "
                       "change with the epoch (DistributedSampler seeds it with seed + epoch)")
                expect(False, f"size {size}, world {world_size}, rank {rank}, epoch {epoch}: "
                              f"expected {want}, got {got}: rank r's share is every "
                              "world_size-th index of the padded shuffle, from index r on")


def _crashing_save(real_save):
    """A torch.save that writes half of the bytes and then fails, like a full disk."""

    def save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data)
        else:
            f.write(data)
        raise OSError("No space left on device (simulated while saving)")

    return save


def _load(path: str):
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # any failure to read means the file is damaged
        return None


@exercise("9.2")
def atomic_save(save) -> None:
    """``save(obj, path)`` must leave either the old file or the new one, never half."""
    expect_function(save, "check.nb09.atomic_save(save_atomic)")
    used = names_used(save, ("write_atomic", "save_checkpoint"))
    expect(not used, f"your function calls the library's {(used or [''])[0]}: the point is to "
                     "write the two steps yourself")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pt")
        call(save, {"step": 1}, path)
        expect(os.path.exists(path), "after save(obj, path) there is no file at path: what "
                                     "was written never took path's place")
        expect(_load(path) == {"step": 1}, "the file at path does not hold what was saved")
        real_save = torch.save
        torch.save = _crashing_save(real_save)
        try:
            save({"step": 2}, path)
            crashed = False
        except Exception:  # the simulated crash is expected to come through
            crashed = True
        finally:
            torch.save = real_save
        expect(crashed, "the simulated crash inside torch.save did not reach the caller: "
                        "a swallowed error leaves the caller believing the checkpoint is safe")
        expect(_load(path) == {"step": 1},
               "a crash while writing destroyed the previous checkpoint: the new bytes went "
               "straight into path, so half a file took the old one's place")


# ---- a complete DDP script: the learner's own file, launched on 2, 3 and 4 processes ------

MY_DDP_FILE = "workspace/my_ddp_train.py"
DDP_CASES = "course_lib.check.cases.ddp_script_cases"
DEADLINE_S = 60.0  # a launch builds DDP models and trains: more than a ring needs
SAME_ORDER = "Every rank must make the same collective calls in the same order."
DDP_ADVICE = Advice(all_send=SAME_ORDER, all_recv=SAME_ORDER, mismatch=SAME_ORDER,
                    size=SAME_ORDER)


def _close(a, b) -> bool:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5))


def explain_ddp_error(error: dict, text: str) -> str:
    if "initialize the default process group twice" in error["message"]:
        return ("train(config) runs in a process group that is already started (by main(), "
                "or by the checker), so starting one inside train fails: that is main()'s "
                "job.")
    return ""


def judge_saves(rank: int, s: dict) -> None:
    expect(rank == 0 or not s["saves"], f"rank {rank} wrote the checkpoint too: every rank "
                                        "writes the same file at once, which can leave it "
                                        "damaged, and one copy is enough (the replicas are "
                                        "equal)")
    if rank != 0:
        return
    c = s["checkpoint"]
    expect(s["saves"] and c.get("found"), "rank 0 wrote no checkpoint at config.checkpoint: "
                                          "the file was not there when train returned")
    expect(c.get("state_dict"), "the checkpoint is not a state_dict (the tensors by name): a "
                                "whole module or another object does not load into a fresh "
                                "model with load_state_dict")
    expect(not c.get("ddp_keys"), "the checkpoint's names start with 'module.': that is the "
                                  "DDP wrapper's state_dict, which does not load into a model "
                                  "without DDP; the model inside the wrapper has plain names")
    expect(_close(c["params"], s["returned"]["params"]),
           "the checkpoint does not hold the final weights: it was written before the last "
           "optimizer step")


WEIGHT_MISTAKES = {  # ddp_script_cases' known mistakes: what each one's weights mean
    "no_set_epoch": "every epoch saw its examples in the same order: DistributedSampler "
                    "shuffles with seed + epoch, and the epoch is yours to tell it each epoch",
    "loss_not_scaled": "each step's gradient is accum_steps times too large: a micro-step's "
                       "loss is a mean, and accum_steps backward passes add up accum_steps "
                       "means, where the step needs their mean",
    "loss_over_world": "each step's gradient is world_size times too small: DDP already "
                       "averages over the ranks (it divides their sum by world_size), so "
                       "dividing the loss by world_size divides twice",
}


def judge_ddp_rank(rank: int, s: dict) -> None:
    got, right = s["returned"], s["expected"]
    expect(got["ok"], "train(config) must return {\"model\": the trained module, \"losses\": "
                      f"[one number per optimizer step]}}; it returned {got.get('what')}")
    expect(s["ddp_models"] > 0, "train(config) never wrapped the model in "
                                "DistributedDataParallel: DDP averages the gradients")
    if not _close(got["params"], right["params"]):
        for mistake, hint in WEIGHT_MISTAKES.items():
            expect(not _close(got["params"], s["mistakes"][mistake]), hint)
        expect(False, f"rank {rank}'s final weights differ from one process trained on every "
                      "rank's micro-batches of each step at once: each optimizer step must use "
                      "the mean gradient of the step's micro-batches on every rank (look at "
                      "the loss's scale, and at when the optimizer steps and zeroes)")
    judge_saves(rank, s)
    expect(len(got["losses"]) == s["steps"], f"rank {rank} logged {len(got['losses'])} losses "
                                             f"for {s['steps']} optimizer steps: log one per "
                                             "optimizer step")


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


def loss_factor_causes(logged: list, right: list, n: int, k: int) -> str:
    """Why the logged losses are a known factor off the right ones, or ""."""
    causes = {n: ["the sum over the ranks, not their mean"]}
    causes.setdefault(k, []).append("each micro-step's loss added as it is, not divided by "
                                    "the number of micro-steps")
    for factor, why in causes.items():
        if factor != 1 and _close(logged, [v * factor for v in right]):
            return f"the logged losses are {factor} times too large: {' or '.join(why)}"
    return ""


def judge_losses(by_rank: dict, n: int, k: int) -> None:
    losses = [by_rank[r]["returned"]["losses"] for r in range(n)]
    differ = next((r for r in range(1, n) if not _close(losses[r], losses[0])), None)
    expect(differ is None, f"rank 0 and rank {differ} logged different losses: each logged "
                           "the loss of its own micro-batches, not the mean over the global "
                           "batch, which is the same number on every rank")
    right = by_rank[0]["expected"]["losses"]
    if not _close(losses[0], right):
        expect(False, loss_factor_causes(losses[0], right, n, k) or
               "the logged losses are not the mean loss of each step's global batch: every "
               "micro-step's loss of every rank must count once, with the same weight")


def _file_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def check_config_class(path: str) -> None:
    tree = ast.parse(_file_text(path))
    config = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config"),
                  None)
    expect(config is not None, f"{path} defines no class Config: keep the @dataclass Config "
                               "the exercise gives, at the top level of the file")
    fields = {n.target.id for n in config.body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    missing = [f for f in ddp_script_cases.FIELDS if f not in fields]
    expect(not missing, f"Config has no field {(missing or [''])[0]}: keep the fields the "
                        "exercise gives (the checker sets them)")


@exercise("9.3")
def my_ddp_train(path: str = MY_DDP_FILE, world_sizes=WORLD_SIZES) -> None:
    """``train(config)`` in the learner's file: DDP, sampler, no_sync, logging, checkpoint."""
    expect_path(path, f'check.nb09.my_ddp_train("{MY_DDP_FILE}")')
    learner = find_learner_file(path, ("train", "main"))
    check_config_class(path)
    check_main(path)  # read, not launched: before the launch, which takes a while
    text = _file_text(path)
    folder = tempfile.mkdtemp(prefix="course-ddp-check-")

    def judge_case(summary, by_rank, run):
        for rank in range(summary["ranks"]):
            judge_ddp_rank(rank, by_rank[rank])
        judge_syncs(by_rank[0], text)
        judge_losses(by_rank, summary["ranks"], by_rank[0]["accum_steps"])

    try:
        check_file(learner, DDP_CASES, {"folder": folder}, world_sizes, DDP_ADVICE,
                   judge_case, explain_ddp_error, deadline_s=DEADLINE_S)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    record_pass("9.3", path)


MAIN_STEPS = (("init_process_group", "start the process group (train expects one started)"),
              ("train", "call train with a Config"),
              ("destroy_process_group", "end the process group once train has returned"))


def check_main(path: str) -> None:
    """main() is not launched by the checker: read that it starts, trains and ends."""
    main = next(n for n in ast.parse(_file_text(path)).body
                if isinstance(n, ast.FunctionDef) and n.name == "main")
    if "NotImplementedError" in ast.unparse(main):
        raise NotImplementedError("main() is still open")
    calls = {getattr(c.func, "attr", getattr(c.func, "id", None)) for c in ast.walk(main)
             if isinstance(c, ast.Call)}
    for name, what in MAIN_STEPS:
        expect(name in calls, f"main() does not {what}: torchrun runs main() on every rank "
                              "(the checker calls train itself, so only main() lacks it)")
