"""What this machine offers the course: Python, torch, CPUs, GPUs and the backend (notebook 00)."""

from __future__ import annotations

import os
import platform
import sys

import torch

from course_lib.runtime.worker import choose_backend


def environment_report(nproc: int = 2) -> dict:
    """The facts a learner checks first, as a dict of short strings and numbers."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "operating system": f"{platform.system()} {platform.machine()}",
        "cpu cores": os.cpu_count() or 1,
        "cuda available": torch.cuda.is_available(),
        "gpus": gpus,
        "gpu names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        f"backend for {nproc} processes": choose_backend(nproc),
        "nccl available": torch.distributed.is_nccl_available(),
        "gloo available": torch.distributed.is_gloo_available(),
    }


def print_report(report: dict) -> None:
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")


def check_ready(report: dict) -> list[str]:
    """Problems that stop the course from running here (an empty list means ready)."""
    problems = []
    if sys.version_info < (3, 11):
        problems.append("Python 3.11 or newer is needed; run scripts/start.sh with it")
    if not report["gloo available"]:
        problems.append("this torch build has no Gloo backend; install torch from requirements.txt")
    if not report["torch"].startswith("2.13.0"):
        problems.append(f"torch {report['torch']} is not the pinned 2.13.0; saved outputs may "
                        "differ (scripts/start.sh installs the pinned version)")
    return problems
