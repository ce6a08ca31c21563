"""Checkpoints: a resumed run continues bit for bit; a run killed mid-write loses nothing."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from course_lib.runtime.launch import LaunchError, launch
from course_lib.train.checkpoint import (
    CRASH_ENV,
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
)
from course_lib.train.config import ConfigError, parse_config
from course_lib.train.trainer import main, run_single_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


@pytest.mark.slow
def test_resume_without_a_checkpoint_on_two_processes_says_so_once(tmp_path):
    run = launched("--checkpoint-dir", str(tmp_path), "--resume", "--steps", "2")
    assert run.result["steps"] == [1, 2]
    said = [line for line in run.output.splitlines() if "no checkpoint in" in line]
    assert said == [f"[rank 0] no checkpoint in {tmp_path} yet: starting at step 1"]


def corrupt(folder) -> str:
    """A checkpoint file cut short, as a copy interrupted half-way leaves it."""
    folder.mkdir(exist_ok=True)
    path = checkpoint_path(str(folder))
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 not a whole checkpoint")
    return path


def test_unreadable_checkpoint_gives_a_clear_error(tmp_path):
    corrupt(tmp_path)
    with pytest.raises(CheckpointError, match="cannot be read.*delete it") as caught:
        load_checkpoint(str(tmp_path))
    assert isinstance(caught.value, ConfigError)  # the trainer reports it as bad input


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path):
    torch.save({"weights": torch.zeros(2)}, checkpoint_path(str(tmp_path)))
    with pytest.raises(CheckpointError, match="not a checkpoint of course_lib.train .*model"):
        load_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        load_checkpoint(checkpoint_path(str(tmp_path)))


@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]], ids=["one-process", "nproc-2"])
def test_corrupt_checkpoint_ends_with_one_line_and_no_traceback(tmp_path, nproc):
    path = corrupt(tmp_path / "ckpt")
    done = subprocess.run([sys.executable, "-m", "course_lib.train", *nproc, "--steps", "2",
                           "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""  # refused before any rank started
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {path} cannot be read")
    assert "delete it to start over, or pass another --checkpoint-dir" in done.stderr


@pytest.mark.parametrize("rank, says", [("0", True), ("1", False)])
def test_under_torchrun_only_rank_0_reports_the_corrupt_checkpoint(tmp_path, monkeypatch,
                                                                   capsys, rank, says):
    corrupt(tmp_path)
    for name, value in {"RANK": rank, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}.items():
        monkeypatch.setenv(name, value)
    joined = []
    monkeypatch.setattr("course_lib.train.trainer.worker", lambda **kw: joined.append(kw))
    code = main(["--checkpoint-dir", str(tmp_path), "--resume"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and joined == []  # every rank stops before the rendezvous
    assert err.count("\n") == (1 if says else 0) and "Traceback" not in err
    assert ("cannot be read" in err) == says


def test_a_checkpoint_spoilt_after_the_check_still_ends_with_one_line(tmp_path, monkeypatch,
                                                                     capsys):
    """The load inside the run (after the process group exists) reports the same way."""
    corrupt(tmp_path)
    monkeypatch.setattr("course_lib.train.checkpoint.check_checkpoint", lambda folder: None)
    code = main(["--steps", "2", "--checkpoint-dir", str(tmp_path), "--resume"])
    out, err = capsys.readouterr()
    assert code == 2 and not dist.is_initialized()
    assert err.count("\n") == 1 and err.startswith("error: ") and "cannot be read" in err


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
