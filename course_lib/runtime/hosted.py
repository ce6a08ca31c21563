"""The course on Colab or Kaggle: what every notebook's first cell runs there, and only there.

    %run {COURSE}/course_lib/runtime/hosted.py      (after the cell cloned the course)

The platform's own torch and numpy are used as they are, never replaced:

- the course goes on the path of this kernel (``sys.path``) and of every process it starts
  (``PYTHONPATH``: the ranks of ``launch``, a ``!torchrun ...`` cell);
- pip installs only what the course imports and the platform lacks, with the platform's torch
  and numpy pinned as they are;
- one line says so when the platform's torch is older than the course supports;
- on Kaggle, ``NCCL_CUMEM_HOST_ENABLE=0`` (see ``KAGGLE_NCCL``);
- the kernel moves into the course's ``notebooks/`` folder, where ``workspace/`` is made.

It imports only the standard library: ``course_lib`` cannot be imported before it has run.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

PLATFORM_MARKERS = {"colab": "COLAB_RELEASE_TAG", "kaggle": "KAGGLE_KERNEL_RUN_TYPE"}
KEPT = ("torch", "numpy")  # the platform's own: never installed, upgraded or replaced
KAGGLE_NCCL = {
    # Kaggle's two T4s have no peer-to-peer access between them; NCCL 2.24 and newer then
    # can fail the first collective ("peer access is not supported between these two
    # devices") unless its host-memory buffers are turned off.
    "NCCL_CUMEM_HOST_ENABLE": "0",
}


def platform(env=None) -> str | None:
    """``"colab"``, ``"kaggle"`` or None (anywhere else: the cell does nothing there)."""
    env = os.environ if env is None else env
    return next((name for name, marker in PLATFORM_MARKERS.items() if marker in env), None)


def course_root() -> Path:
    return Path(__file__).resolve().parents[2]  # course_lib/runtime/hosted.py -> the clone


def declared(root: Path) -> dict[str, str]:
    """pyproject.toml's dependencies: name -> lower bound ("" when none is given)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    found = {}
    for requirement in project["dependencies"]:
        name, bound = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:>=\s*([\w.]+))?", requirement).groups()
        found[name.lower()] = bound or ""
    return found


def version_tuple(version: str) -> tuple[int, ...]:
    """'2.8.0+cu126' -> (2, 8, 0): enough to compare with a lower bound."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(requirements: dict[str, str]) -> list[str]:
    """The requirements (as pip specs) not installed or below their bound, torch and numpy
    left out: the platform's are what the course runs with."""
    specs = []
    for name, bound in requirements.items():
        have = installed(name)
        if name in KEPT or (have and (not bound or version_tuple(have) >= version_tuple(bound))):
            continue
        specs.append(f"{name}>={bound}" if bound else name)
    return specs


def install(specs: list[str]) -> None:
    """pip install ``specs`` with torch and numpy pinned at the platform's versions."""
    pins = [f"{name}=={installed(name)}" for name in KEPT if installed(name)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(pins) + "\n")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "-c", constraints.name, *specs]
    done = subprocess.run(command, capture_output=True, text=True)
    os.unlink(constraints.name)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {' '.join(specs)}:\n{done.stderr[-2000:]}")


def torch_notice(requirements: dict[str, str]) -> str | None:
    """One line when the platform's torch is older than the course's lower bound."""
    have, bound = installed("torch"), requirements.get("torch", "")
    if have is None:
        return "[course] this platform has no torch: install it (pip install torch), then rerun"
    if bound and version_tuple(have) < version_tuple(bound):
        return (f"[course] this platform's torch {have} is older than {bound}, the oldest the "
                f"course supports: pip install 'torch>={bound}', restart the runtime, rerun")
    return None


def on_path(root: Path) -> None:
    """This kernel and every process it starts import course_lib from ``root``."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])


def gpu_line(name: str) -> str:
    """What the platform's GPUs mean for the course's runs (torch is imported here)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        return "no GPU: every run uses Gloo on the CPU"
    if gpus == 1:
        return ("1 GPU: one process runs on it (NCCL); runs of 2 processes or more use Gloo "
                "on the CPU, one GPU per process being NCCL's rule")
    extra = " (NCCL_CUMEM_HOST_ENABLE=0: these GPUs have no peer access)" if name == "kaggle" \
        else ""
    return f"{gpus} GPUs: up to {gpus} processes use NCCL, one per GPU{extra}; more use Gloo"


def set_up(root: Path | None = None, env=None) -> str | None:
    """Everything above, on a platform; returns the summary line, or None elsewhere."""
    name = platform(env)
    if name is None:
        return None
    root = root or course_root()
    requirements = declared(root)
    on_path(root)
    if name == "kaggle":
        for key, value in KAGGLE_NCCL.items():
            os.environ.setdefault(key, value)
    specs = missing(requirements)
    if specs:
        install(specs)
    notice = torch_notice(requirements)
    if notice:
        print(notice)
    os.chdir(root / "notebooks")
    return (f"[course] {name}: the course from {root}, torch {installed('torch')} and numpy "
            f"{installed('numpy')} as the platform has them, {gpu_line(name)}")


STUDENT_BRANCH = "student"  # where the publishing workflow puts the student copies
SETUP_CELL = """\
# Colab or Kaggle only: fetch the course and set it up beside the platform's own torch.
# Anywhere else (your own machine, scripts/start.sh) this cell does nothing.
import os

if any(marker in os.environ for marker in {markers}):
    COURSE = os.environ.get("COURSE_HOME", os.path.expanduser("~/gradients-to-all-reduce"))
    SOURCE = os.environ.get("COURSE_SOURCE", "{repository}")
    if not os.path.isdir(COURSE):
        !git clone --quiet --depth 1 {{SOURCE}} {{COURSE}}
    if not os.path.isdir(COURSE):
        raise RuntimeError(f"could not fetch {{SOURCE}}: on Kaggle, switch Internet on (Settings)")
    %run {{COURSE}}/course_lib/runtime/hosted.py"""


def repository(root: Path | None = None) -> str:
    """Where the course is published: pyproject.toml's [project.urls] Repository."""
    project = tomllib.loads(((root or course_root()) / "pyproject.toml").read_text())["project"]
    return project["urls"]["Repository"].rstrip("/")


def setup_cell(repository: str) -> str:
    """Every notebook's first code cell (scripts/hosted_cells.py writes it)."""
    markers = ", ".join(f'"{marker}"' for marker in PLATFORM_MARKERS.values())
    return SETUP_CELL.format(markers=f"({markers})", repository=repository)


def open_links(repository: str, notebook: str) -> str:
    """The title cell's line of links that open ``notebook``'s student copy on each platform."""
    path = repository.removeprefix("https://github.com/") + f"/blob/{STUDENT_BRANCH}/notebooks/"
    colab = f"https://colab.research.google.com/github/{path}{notebook}"
    kaggle = f"https://kaggle.com/kernels/welcome?src=https://github.com/{path}{notebook}"
    return f"[Open in Colab]({colab}) · [Open in Kaggle]({kaggle})"


if __name__ == "__main__":
    summary = set_up()
    print(summary or "[course] not on Colab or Kaggle: nothing to set up")
