"""The course on Colab and Kaggle: every notebook's first cell and what it runs there
(course_lib/runtime/hosted.py), tried as a platform would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from course_lib.runtime import hosted

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import hosted_cells  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_every_notebook_carries_the_current_links_and_setup_cell():
    repo = hosted.repository(ROOT)
    stale = [path.name for path in NOTEBOOKS
             if hosted_cells.text(hosted_cells.current(json.loads(path.read_text()), path.name,
                                                      repo)) != path.read_text()]
    assert not stale, f"run python scripts/hosted_cells.py --write: {stale}"
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        first_code = next(c for c in cells if c["cell_type"] == "code")
        assert "".join(first_code["source"]) == hosted.setup_cell(repo)
        assert hosted.open_links(repo, path.name) in "".join(cells[0]["source"])


def test_the_cell_looks_for_the_platforms_hosted_py_knows():
    cell = hosted.setup_cell("https://github.com/someone/course")
    for marker in hosted.PLATFORM_MARKERS.values():
        assert f'"{marker}"' in cell
    assert '"https://github.com/someone/course"' in cell
    assert "course_lib/runtime/hosted.py" in cell
    assert (ROOT / "course_lib" / "runtime" / "hosted.py").exists()


@pytest.mark.parametrize("env, name", [({}, None), ({"COLAB_RELEASE_TAG": "x"}, "colab"),
                                       ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "kaggle"),
                                       ({"PATH": "/bin"}, None)])
def test_platform_is_read_from_its_marker(env, name):
    assert hosted.platform(env) == name
    if name is None:
        assert hosted.set_up(ROOT, env) is None  # nothing happens anywhere else


def test_missing_never_names_torch_or_numpy_and_respects_bounds(monkeypatch):
    have = {"torch": "2.1.0", "numpy": "1.20.0", "matplotlib": "3.8.0", "psutil": "5.0.0"}
    monkeypatch.setattr(hosted, "installed", have.get)
    wanted = {"torch": "2.6", "numpy": "1.24", "matplotlib": "3.7", "psutil": "5.9",
              "nbformat": "5.7", "ipywidgets": ""}
    assert hosted.missing(wanted) == ["psutil>=5.9", "nbformat>=5.7", "ipywidgets"]
    notice = hosted.torch_notice(wanted)
    assert "torch 2.1.0 is older than 2.6" in notice and notice.count("\n") == 0
    monkeypatch.setattr(hosted, "installed", {"torch": "2.8.0+cu126"}.get)
    assert hosted.torch_notice(wanted) is None


def test_declared_reads_pyprojects_lower_bounds():
    found = hosted.declared(ROOT)
    assert found["torch"] and hosted.version_tuple(found["torch"]) >= (2, 0)
    assert set(found) >= {"torch", "numpy", "matplotlib"}


def test_the_setup_cell_does_nothing_here(tmp_path):
    """Run as a notebook runs it, without a platform's marker: no output, nothing changed."""
    script = ("import os, sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
              "shell = InteractiveShell.instance()\nbefore = os.getcwd()\n"
              "result = shell.run_cell(sys.argv[1])\nassert result.success\n"
              "assert 'COURSE' not in shell.user_ns and os.getcwd() == before\n")
    env = {k: v for k, v in os.environ.items() if k not in hosted.PLATFORM_MARKERS.values()}
    done = subprocess.run([sys.executable, "-c", script, hosted.setup_cell("file:///nowhere")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


RANKS_REPORT = """\
import course_lib
import torch.distributed as dist
from course_lib.runtime.launch import save_result

dist.init_process_group("gloo")
paths = [None] * dist.get_world_size()
dist.all_gather_object(paths, course_lib.__file__)
save_result(paths)
dist.destroy_process_group()
"""

KERNEL = """\
import json, os, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
assert shell.run_cell(sys.argv[1]).success, "the setup cell failed"
assert shell.run_cell('''
import json, os, course_lib, numpy, torch
from course_lib.runtime.launch import launch
run = launch(sys.argv[2], nproc=2, quiet=True, timeout_s=120)
print("REPORT", json.dumps({"kernel": course_lib.__file__, "torch": torch.__file__,
      "numpy": numpy.__file__, "ranks": run.result, "cwd": os.getcwd(),
      "nccl": os.environ.get("NCCL_CUMEM_HOST_ENABLE")}))
''').success, "the launch failed"
"""


@pytest.mark.slow
def test_on_kaggle_the_cell_keeps_the_platforms_torch_and_launched_ranks_import_course_lib(
        tmp_path):
    """A fresh venv that already holds torch (the course's own, on its path as a platform's
    would be), Kaggle's marker, this repository as the source: the cell clones it, the kernel
    and both ranks of a launch import course_lib from the clone, torch stays where it was."""
    venv, clone = tmp_path / "platform", tmp_path / "course"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                    "--without-pip", str(venv)], check=True, timeout=120)
    platform_python = venv / "bin" / "python"
    purelib = subprocess.run([str(platform_python), "-c", "import sysconfig; print("
                              "sysconfig.get_paths()['purelib'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # torch, numpy, IPython: the platform's packages
    Path(purelib, "platform_packages.pth").write_text(ours + "\n")
    (tmp_path / "ranks_report.py").write_text(RANKS_REPORT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", *hosted.PLATFORM_MARKERS.values())}
    env.update({"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "COURSE_SOURCE": f"file://{ROOT}",
                "COURSE_HOME": str(clone), "PATH": f"{venv / 'bin'}:{env['PATH']}"})
    done = subprocess.run([str(platform_python), "-c", KERNEL, hosted.setup_cell("unused"),
                           str(tmp_path / "ranks_report.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.split("REPORT ", 1)[1].splitlines()[0])
    assert "[course] kaggle: the course from " + str(clone) in done.stdout
    assert report["kernel"].startswith(str(clone))  # the kernel imports the clone
    assert len(report["ranks"]) == 2 and all(p.startswith(str(clone)) for p in report["ranks"])
    assert report["torch"].startswith(ours) and report["numpy"].startswith(ours)  # not replaced
    assert not list(Path(purelib).glob("torch*")) and not list(Path(purelib).glob("numpy*"))
    assert report["cwd"] == str(clone / "notebooks") and report["nccl"] == "0"


def test_the_links_open_the_branch_the_workflow_publishes_student_copies_to():
    import yaml

    workflow = yaml.safe_load((ROOT / ".github/workflows/student-branch.yml").read_text())
    steps = "\n".join(step.get("run", "") for step in workflow["jobs"]["publish"]["steps"])
    assert "scripts/make_student_notebooks.py" in steps and "BEGIN SOLUTION" in steps
    assert f"git push --force origin HEAD:{hosted.STUDENT_BRANCH}" in steps
    assert f"/blob/{hosted.STUDENT_BRANCH}/notebooks/" in hosted.open_links("https://x/y", "a")
