"""Checkpoints: a resumed run continues bit for bit; a run killed mid-write loses nothing."""

import json
import os

import pytest
import torch

from course_lib.runtime.launch import LaunchError, launch
from course_lib.train.checkpoint import CRASH_ENV, checkpoint_path, load_checkpoint
from course_lib.train.config import parse_config
from course_lib.train.trainer import run_single_process

STEPS = 8
# dropout on: the random generators must be restored too, or the resumed run drifts
COMMON = ["--steps", str(STEPS), "--global-batch", "16", "--accum-steps", "2",
          "--dropout", "0.1", "--seed", "5", "--log-every", "4"]  # small for test speed


def in_process(*args):
    return run_single_process(parse_config([*COMMON, *args]))


def launched(*args, env=None):
    return launch("course_lib.train", 2, [*COMMON, *args], timeout_s=180, quiet=True,
                  env=env)


def read_metrics(path):
    return [json.loads(line) for line in open(path).read().splitlines()]


def test_stop_and_resume_in_one_process_is_bitwise_equal(tmp_path, capsys):
    whole = in_process()
    folder, metrics = str(tmp_path / "ckpt"), str(tmp_path / "m.jsonl")
    first = in_process("--checkpoint-dir", folder, "--stop-after", "3", "--metrics", metrics)
    assert first["steps"] == [1, 2, 3] and load_checkpoint(folder)["step"] == 3
    second = in_process("--checkpoint-dir", folder, "--resume", "--metrics", metrics)
    assert second["first_step"] == 4 and second["steps"] == [4, 5, 6, 7, 8]
    assert first["losses"] + second["losses"] == whole["losses"]  # exact, not close
    assert second["param_checksum"] == whole["param_checksum"]
    assert [m["loss"] for m in read_metrics(metrics)] == whole["losses"]  # appended
    assert "resumed after step 3" in capsys.readouterr().out


def test_dropout_really_draws_random_numbers():
    """Otherwise the test above would pass without restoring any generator."""
    assert in_process()["losses"] != in_process("--dropout", "0.2")["losses"]


def test_resume_without_a_checkpoint_starts_at_step_one(tmp_path, capsys):
    run = in_process("--checkpoint-dir", str(tmp_path), "--resume", "--steps", "2")
    assert run["steps"] == [1, 2]
    assert "no checkpoint in" in capsys.readouterr().out


def test_unreadable_checkpoint_gives_a_clear_error(tmp_path):
    with open(checkpoint_path(str(tmp_path)), "wb") as f:
        f.write(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot be read.*delete it"):
        load_checkpoint(str(tmp_path))


def test_killed_while_writing_keeps_the_previous_checkpoint_and_resumes_exactly(tmp_path):
    whole = launched().result
    folder, metrics = str(tmp_path / "ckpt"), str(tmp_path / "m.jsonl")
    args = ["--checkpoint-dir", folder, "--checkpoint-every", "1", "--metrics", metrics]
    with pytest.raises(LaunchError, match="rank 0 (was killed|failed)"):
        launched(*args, env={CRASH_ENV: "6"})  # rank 0 is killed half-way through step 6's
    state = load_checkpoint(folder)  # the previous checkpoint is whole
    assert state["step"] == 5 and state["world_size"] == 2
    assert len(state["rng"]) == 2  # every rank's generators, gathered by rank 0
    assert not torch.equal(state["rng"][0]["cpu"], state["rng"][1]["cpu"])
    half = checkpoint_path(folder) + ".tmp"
    assert os.path.getsize(half) < os.path.getsize(checkpoint_path(folder))
    with pytest.raises(Exception):  # noqa: B017 - any error: the half file is unreadable
        torch.load(half, weights_only=True)
    resumed = launched(*args, "--resume").result
    assert resumed["steps"] == [6, 7, 8]
    assert resumed["losses"] == whole["losses"][5:]  # bitwise: same data, weights, RNG
    assert resumed["param_checksum"] == whole["param_checksum"]
    assert resumed["replicas_bitwise_equal"] is True
    by_step = {}
    for m in read_metrics(metrics):  # step 6 ran twice: before the crash and after resume
        assert by_step.setdefault(m["step"], m["loss"]) == m["loss"]
    assert [by_step[s] for s in range(1, STEPS + 1)] == whole["losses"]
