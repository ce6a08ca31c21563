"""The worker-side helper: backend choice and its clear errors (no process group needed)."""

import pytest
import torch

from course_lib.runtime.worker import check_backend_fits, choose_backend


def test_gloo_without_gpus_and_override_by_environment():
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    assert choose_backend(2, env={}) == ("nccl" if has_gpus else "gloo")
    assert choose_backend(2, env={"COURSE_BACKEND": "gloo"}) == "gloo"
    assert choose_backend(2, env={"COURSE_BACKEND": " NCCL "}) == "nccl"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="use 'gloo' or 'nccl'"):
        choose_backend(1, env={"COURSE_BACKEND": "mpi"})


def test_nccl_needs_one_gpu_per_process():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"{gpus + 1} processes on this machine but {gpus}"):
        check_backend_fits("nccl", gpus + 1)
    check_backend_fits("gloo", 64)  # Gloo runs any number of processes on the CPU
