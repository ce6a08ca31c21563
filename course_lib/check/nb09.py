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

from course_lib.check.answers import call, describe, expect_function
from course_lib.check.checker import exercise, expect
from course_lib.check.mp import ddp_script_cases
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


@exercise("9.1", pointer=(
    "Make a torch.Generator, seed it with seed + epoch, and draw "
    "torch.randperm(size, generator=g).tolist(). The total length is the smallest multiple "
    "of world_size that holds size indices; append the first (total - size) indices of the "
    "permutation to reach it. Rank r's share is a slice that starts at r and steps by "
    "world_size."))
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
                       "epoch 1 gives the same order as epoch 0: seed the shuffle with "
                       "seed + epoch (that is what set_epoch does)")
                expect(False, f"size {size}, world {world_size}, rank {rank}, epoch {epoch}: "
                              f"expected {want}, got {got}. Shuffle with torch.randperm and "
                              "a Generator seeded with seed + epoch, pad, then take every "
                              "world_size-th index starting at rank")


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
    except Exception:  # noqa: BLE001 - any failure to read means the file is damaged
        return None


@exercise("9.2", pointer=(
    "Two lines. First torch.save the object to another name in the same folder, path + "
    "\".tmp\": a crash there leaves path as it was. Then os.replace(tmp, path), which swaps "
    "the name over in one step: anyone reading path sees the old file or the new one. Let "
    "errors pass through (no try/except)."))
def atomic_save(save) -> None:
    """``save(obj, path)`` must leave either the old file or the new one, never half."""
    expect_function(save, "check.nb09.atomic_save(save_atomic)")
    used = names_used(save, ("write_atomic", "save_checkpoint"))
    expect(not used, f"your function calls the library's {(used or [''])[0]}: the point is to "
                     "write the two steps yourself")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pt")
        call(save, {"step": 1}, path)
        expect(os.path.exists(path), "after save(obj, path) there is no file at path: write "
                                     "to a temporary file, then os.replace it onto path")
        expect(_load(path) == {"step": 1}, "the file at path does not hold what was saved")
        real_save = torch.save
        torch.save = _crashing_save(real_save)
        try:
            save({"step": 2}, path)
            crashed = False
        except Exception:  # noqa: BLE001 - the simulated crash is expected to come through
            crashed = True
        finally:
            torch.save = real_save
        expect(crashed, "the simulated crash inside torch.save did not reach the caller: "
                        "do not swallow errors while saving")
        expect(_load(path) == {"step": 1},
               "a crash while writing destroyed the previous checkpoint: write the new one "
               "to path + '.tmp' and only then os.replace(tmp, path)")


# ---- a complete DDP script: the learner's own file, launched on 2, 3 and 4 processes ------

MY_DDP_FILE = "workspace/my_ddp_train.py"
DDP_CASES = "course_lib.check.mp.ddp_script_cases"
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
                "or by the checker): call dist.init_process_group in main(), not in train.")
    return ""


def judge_saves(rank: int, s: dict) -> None:
    expect(rank == 0 or not s["saves"], f"rank {rank} wrote the checkpoint too: every rank "
                                        "writes it, all to the same file; only rank 0 should "
                                        "(the replicas are equal)")
    if rank != 0:
        return
    c = s["checkpoint"]
    expect(s["saves"] and c.get("found"), "rank 0 wrote no checkpoint at config.checkpoint: "
                                          "save the model there with torch.save at the end")
    expect(c.get("state_dict"), "the checkpoint is not a state_dict: save "
                                "model.module.state_dict(), the tensors by name")
    expect(not c.get("ddp_keys"), "the checkpoint's names start with 'module.': that is the "
                                  "DDP wrapper's state_dict; save model.module.state_dict(), "
                                  "which loads into a model without DDP")
    expect(_close(c["params"], s["returned"]["params"]),
           "the checkpoint does not hold the final weights: save after the last step")


def judge_ddp_rank(rank: int, s: dict) -> None:
    got, right = s["returned"], s["expected"]
    expect(got["ok"], "train(config) must return {\"model\": the trained module, \"losses\": "
                      f"[one number per optimizer step]}}; it returned {got.get('what')}")
    expect(s["ddp_models"] > 0, "train(config) never wrapped the model in "
                                "DistributedDataParallel: DDP averages the gradients")
    if not _close(got["params"], right["params"]):
        expect(not _close(got["params"], s["no_set_epoch"]),
               "every epoch saw its examples in the same order: DistributedSampler shuffles "
               "with seed + epoch, and the epoch is yours to tell it each epoch")
        expect(False, f"rank {rank}'s final weights differ from one process trained on every "
                      "rank's micro-batches of each step at once: scale each micro-step's loss "
                      "by 1 / accum_steps and step once every accum_steps micro-batches")
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
                  "optimizer steps: only the last micro-step of a step needs to; run the "
                  "others inside model.no_sync()")


def judge_losses(by_rank: dict, n: int) -> None:
    losses = [by_rank[r]["returned"]["losses"] for r in range(n)]
    differ = next((r for r in range(1, n) if not _close(losses[r], losses[0])), None)
    expect(differ is None, f"rank 0 and rank {differ} logged different losses: each logged "
                           "its own; all-reduce the loss so that every rank logs the mean over "
                           "the global batch")
    right = by_rank[0]["expected"]["losses"]
    expect(_close(losses[0], right), "the logged losses are not the mean loss of each step's "
                                     "global batch: add up the step's scaled micro-step losses, "
                                     "then average that over the ranks")


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


@exercise("9.3", pointer=(
    "In train: DDP(make_model(config).to(device)); a DistributedSampler(dataset, "
    "num_replicas=world_size, rank=rank, shuffle=True, seed=config.seed) in a DataLoader "
    "with batch_size=config.micro_batch; each epoch starts with sampler.set_epoch(epoch). "
    "For micro-batch i, last = (i + 1) % accum_steps == 0; put BOTH the forward and "
    "loss.backward() inside `model.no_sync()` unless last; on the last, step, zero the "
    "gradients, all-reduce the step's summed loss and divide by the world size. At the end "
    "only rank 0 calls torch.save(model.module.state_dict(), config.checkpoint)."))
def my_ddp_train(path: str = MY_DDP_FILE, world_sizes=WORLD_SIZES) -> None:
    """``train(config)`` in the learner's file: DDP, sampler, no_sync, logging, checkpoint."""
    expect(isinstance(path, (str, os.PathLike)), "pass the path of your file, "
           f'check.nb09.my_ddp_train("{MY_DDP_FILE}"); you passed {describe(path)}')
    learner = find_learner_file(path, ("train", "main"))
    check_config_class(path)
    text = _file_text(path)
    folder = tempfile.mkdtemp(prefix="course-ddp-check-")

    def judge_case(summary, by_rank, run):
        for rank in range(summary["ranks"]):
            judge_ddp_rank(rank, by_rank[rank])
        judge_syncs(by_rank[0], text)
        judge_losses(by_rank, summary["ranks"])

    try:
        check_file(learner, DDP_CASES, {"folder": folder}, world_sizes, DDP_ADVICE,
                   judge_case, explain_ddp_error, deadline_s=DEADLINE_S)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    check_main(path)
    record_pass("9.3", path)


def check_main(path: str) -> None:
    """main() is not launched by the checker: read that it starts, trains and ends."""
    main = next(n for n in ast.parse(_file_text(path)).body
                if isinstance(n, ast.FunctionDef) and n.name == "main")
    if "NotImplementedError" in ast.unparse(main):
        raise NotImplementedError("main() is still open")
    calls = {getattr(c.func, "attr", getattr(c.func, "id", None)) for c in ast.walk(main)
             if isinstance(c, ast.Call)}
    for name, what in (("init_process_group", "start the process group "
                                              "(dist.init_process_group)"),
                       ("train", "call train(Config())"),
                       ("destroy_process_group", "end the process group after train "
                                                 "(dist.destroy_process_group)")):
        expect(name in calls, f"train(config) is right, but main() does not {what}: torchrun "
                              "runs main() on every rank")
