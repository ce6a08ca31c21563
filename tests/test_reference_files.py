"""scripts/reference_files.py: the course's answers to the file exercises, as files, each run
on one process as scripts/gpu_check.sh runs them on a GPU (here on the CPU, Gloo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.runtime.launch import launch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from reference_files import reference_files  # noqa: E402


def written_files() -> set[str]:
    """The workspace files the notebooks' %%writefile cells write, read plainly."""
    names = set()
    for path in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            first = "".join(cell["source"]).split("\n", 1)[0]
            if cell["cell_type"] == "code" and first.startswith("%%writefile workspace/"):
                names.add(first.split("/", 1)[1].strip())
    return names


def test_every_file_exercise_is_written_without_its_markers(tmp_path):
    files = reference_files()
    assert set(files) == written_files() and len(files) >= 10
    assert not any("# BEGIN" in text or "# END" in text for text in files.values())
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "reference_files.py"),
                           str(tmp_path / "workspace")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "workspace").iterdir()) == sorted(files)


@pytest.mark.slow
def test_each_reference_answer_runs_on_one_process(tmp_path, monkeypatch):
    """What gpu_check.sh does on GPU 0 with NCCL, here on the CPU: every file's own __main__
    ends cleanly on one process, run from the folder that holds workspace/."""
    (tmp_path / "workspace").mkdir()
    for name, text in reference_files().items():
        (tmp_path / "workspace" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    for name in sorted(reference_files()):
        run = launch(os.path.join("workspace", name), nproc=1, timeout_s=120, quiet=True)
        assert run.returncode == 0, (name, run.output[-2000:])
