"""Bad options: one clear line on stderr and a non-zero exit before any process group exists."""

import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from course_lib.train.config import ConfigError, TrainConfig, check_config, parse_config
from course_lib.train.trainer import main, without_nproc


def run_main(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's errors
        code = e.code
    out, err = capsys.readouterr()
    assert not dist.is_initialized()  # refused before any process group
    return code, out, err


@pytest.mark.parametrize("argv, words", [
    (["--accum-steps", "0"], "--accum-steps must be >= 1"),
    (["--sync", "fast"], "'fast' is not a strategy"),
    (["--sync", "ddp,ddp"], "not a strategy or a list of different ones"),
    (["--micro-batch", "0"], "--micro-batch must be >= 1"),
    (["--nproc", "4", "--accum-steps", "2", "--global-batch", "36"],
     "global batch 36 is not divisible by world_size 4 x accum_steps 2"),
    (["--micro-batch", "8", "--global-batch", "32"], "not both"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--stop-after", "9", "--steps", "5"], "--stop-after must be between 1 and"),
    (["--d-model", "30", "--n-heads", "4"], "not a multiple of --n-heads"),
    (["--sync", "ddp,ring", "--metrics", "m.jsonl"], "need a single --sync"),
    (["--nproc", "0"], "--nproc must be >= 1"),
    (["--dtype", "float16"], "invalid choice"),
])
def test_bad_option_is_one_line_and_nonzero(argv, words, capsys):
    code, out, err = run_main(argv, capsys)
    assert code not in (0, None)
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err
    assert out == ""


def test_nccl_without_gpus_is_refused_in_the_parent(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_BACKEND", "nccl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, out, err = run_main(["--nproc", "2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "GPU" in err and "gloo" in err


def test_each_worker_checks_before_joining(monkeypatch, capsys):
    """As under torchrun with 3 processes: 32 examples cannot be split 3 ways."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(name, value)
    joined = []
    monkeypatch.setattr("course_lib.train.trainer.worker", lambda **kw: joined.append(kw))
    code, _, err = run_main(["--global-batch", "32"], capsys)
    assert code == 2 and "global batch 32 is not divisible by world_size 3" in err
    assert joined == []  # no rendezvous was attempted
    code, _, err = run_main(["--nproc", "3"], capsys)
    assert code == 2 and "under torchrun leave it out" in err
    assert joined == []


def test_real_command_line_fails_fast_without_starting_workers():
    env = {**os.environ, "COURSE_BACKEND": "nccl", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "course_lib.train", "--nproc", "2"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""  # no rank ever printed
    assert done.stderr.count("\n") == 1 and "needs one GPU per process" in done.stderr


def test_config_helpers():
    config = parse_config(["--accum-steps", "2", "--micro-batch", "4"])
    assert config.global_batch_for(3) == 24 and config.micro_batch_for(3) == 4
    assert TrainConfig(global_batch=24, accum_steps=2).micro_batch_for(3) == 4
    assert parse_config(["--sync", "ring,overlap"]).syncs == ("ring", "overlap")
    check_config(parse_config([]), world_size=4)  # the defaults fit any world size
    assert without_nproc(["--nproc", "2", "--steps", "3", "--timeout=9"]) == ["--steps", "3"]


@pytest.mark.parametrize("field, value", [
    ("loss_norm", "mean"), ("optimizer", "adam"), ("dtype", "float16"), ("sync", "ddp,fast"),
    ("task", "words"),
])
def test_a_config_made_in_code_is_checked_like_the_command_line(field, value):
    """A TrainConfig built without the parser: an unknown name is refused, not run as the
    nearest other branch (train_step would take any loss_norm but "tokens" as the bug)."""
    option = "--" + field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{option} must .* got '{value}'"):
        check_config(TrainConfig(**{field: value}), world_size=1)
