"""The README's commands: scripts/start.sh opens JupyterLab on 127.0.0.1 and stops cleanly;
scripts/env.sh is safe to source; every script refuses what it does not know.

Tests that run scripts/env.sh for real create .venv the first time (a few minutes). The
failing-install tests use a throwaway copy of the scripts whose requirements.txt names a
package that does not exist, with pip told not to look at any index: pip fails at once.
"""

import json
import os
import re
import shlex
import shutil
import signal
import site
import subprocess
import sys
import time
import urllib.request

import pytest

from course_lib.runtime.launch import LOOPBACK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"
MISSING = "no-such-package-for-this-course"


def bash(*args, cwd=ROOT, env=None, timeout=900):
    return subprocess.run(["bash", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def page_config(body: str) -> dict:
    """The settings JupyterLab embeds in its page (id="jupyter-config-data")."""
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                      body, re.S)
    assert found, "no jupyter-config-data in the page"
    return json.loads(found.group(1))


def test_start_sh_serves_the_first_notebook_on_localhost(tmp_path):
    user_config = tmp_path / "user-jupyter"  # stands in for the learner's own ~/.jupyter
    proc = subprocess.Popen(["bash", "scripts/start.sh"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PORT": "8950",
                                 "JUPYTER_CONFIG_DIR": str(user_config)})
    try:
        url, deadline = None, time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            found = re.search(r"http://127\.0\.0\.1:\d+/lab/tree/00_start_here\.ipynb\?token=\w+",
                              line)
            url = found.group(0) if found else None
        assert url, "start.sh printed no address"
        body, deadline = None, time.monotonic() + 90
        while body is None and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None and "JupyterLab" in body
        api = url.split("/lab/")[0] + "/api/contents/00_start_here.ipynb?content=0&token="
        meta = urllib.request.urlopen(api + url.rsplit("token=", 1)[1], timeout=5).read()
        assert b'"type": "notebook"' in meta or b'"type":"notebook"' in meta
        # no "Jupyter news?" pop-up, and the learner's own config was not written to
        assert ANNOUNCEMENTS in page_config(body)["disabledExtensions"]
        assert not (user_config / "labconfig").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.parametrize("script, args", [
    ("start.sh", ["--studnet"]),
    ("start.sh", ["--reset"]),  # known, but only with --student
    ("test.sh", ["--bogus"]),
    ("test.sh", ["--unit", "--notebooks"]),
    ("test.sh", ["--quick", "--bogus"]),  # not "run everything"
    ("execute_notebooks.sh", ["--bogus"]),
    ("execute_notebooks.sh", ["notebooks/99_none.ipynb"]),
    ("gpu_check.sh", ["--bogus"]),
    ("gpu_check.sh", ["out", "extra"]),
])
def test_scripts_refuse_unknown_options_before_installing(script, args, tmp_path):
    venv = tmp_path / "venv"  # were the environment set up first, it would appear here
    done = bash(f"scripts/{script}", *args, env={"COURSE_VENV": str(venv)}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and args[-1] in done.stderr
    assert f"usage: scripts/{script}" in done.stderr
    assert done.stdout == "" and not venv.exists()


def test_slurm_script_refuses_unknown_trainer_options_once():
    """Its options are the trainer's: checked once, before srun or torchrun start anything."""
    done = bash("scripts/slurm_train.sbatch", "--stepz", "3", env={"REHEARSE": "1"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unrecognized arguments: --stepz" in done.stderr
    assert "usage: [DRY_RUN=1|REHEARSE=1] scripts/slurm_train.sbatch" in done.stderr
    assert "torchrun" not in done.stderr and "[rank" not in done.stdout


def test_sourced_env_sh_leaves_the_shell_and_its_options_alone():
    script = ('before="$(set +o; shopt)"; source scripts/env.sh; echo "status=$?"; '
              '[ "$(set +o; shopt)" = "$before" ] && echo same-options; '
              'command -v python; false; echo still-here')
    done = bash("-c", script)
    assert done.stdout.splitlines()[-4:] == [
        "status=0", "same-options", os.path.join(ROOT, ".venv", "bin", "python"), "still-here"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A copy of the scripts whose requirements.txt cannot be installed, and an existing
    environment for it that already imports the course's packages (as after an earlier
    install: these tests' own), with pip kept offline."""
    root = tmp_path_factory.mktemp("broken")
    shutil.copytree(os.path.join(ROOT, "scripts"), root / "scripts")
    (root / "requirements.txt").write_text(f"{MISSING}==1.0\n")
    venv = root / "venv"
    # no pip of its own (5 s of CPU saved): PYTHONPATH below lends it ours, as it lends torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    path = os.pathsep.join([*site.getsitepackages(), os.environ.get("PYTHONPATH", "")])
    env = {"COURSE_VENV": str(venv), "PIP_NO_INDEX": "1", "PYTHON": sys.executable,
           "PYTHONPATH": path.rstrip(os.pathsep)}
    return root, venv, env


def assert_pip_failed(done, venv):
    assert done.returncode != 0
    assert f"No matching distribution found for {MISSING}" in done.stderr  # pip's own words
    assert "error: pip could not install requirements.txt" in done.stderr
    assert not (venv / ".requirements.sha256").exists()  # the next run tries again


@pytest.mark.parametrize("command", [
    ["scripts/env.sh"],
    ["scripts/start.sh"],
    ["scripts/test.sh", "--quick"],
    ["scripts/execute_notebooks.sh"],
])
def test_a_failed_install_stops_the_script_and_records_nothing(broken, command):
    root, venv, env = broken
    (venv / ".requirements.sha256").write_text("an earlier requirements.txt\n")
    done = bash(*command, cwd=root, env=env, timeout=300)
    assert_pip_failed(done, venv)
    assert "The course is starting" not in done.stdout and "== lint" not in done.stdout


def test_sourced_env_sh_whose_install_fails_returns_and_the_shell_goes_on(broken):
    root, venv, env = broken
    done = bash("-c", 'source scripts/env.sh; echo "status=$?"; echo still-here', cwd=root,
                env=env, timeout=300)
    assert done.stdout.splitlines()[-2:] == ["status=1", "still-here"]
    assert done.returncode == 0  # the shell went on to its last command
    assert_pip_failed(subprocess.CompletedProcess([], 1, done.stdout, done.stderr), venv)


def pytest_command(*options) -> list[str]:
    """The unit-test command scripts/test.sh would run with these options."""
    done = bash("scripts/test.sh", *options, "--dry-run", timeout=60)
    assert done.returncode == 0, done.stderr
    runs = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ ")]
    unit = [cmd for cmd in runs if cmd[:3] == ["python", "-m", "pytest"] and "tests" in cmd]
    assert len(unit) == 1, done.stdout
    assert ["ruff", "check", "course_lib", "tests", "scripts", "site"] in runs  # lint runs too
    assert not any("--nbval" in cmd for cmd in runs)  # no notebooks
    return unit[0]


XDIST = {"-n": 2, "--dist": 2, "--no-loadscope-reorder": 1}  # option: words it takes up
COLLECT = """
import contextlib, io, json, sys
import pytest
out = []
for args in json.loads(sys.argv[1]):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = pytest.main([*args, "--collect-only"])
    out.append([int(code), printed.getvalue()])
print(json.dumps(out))
"""


def selection(command: list[str], test_file: str) -> list[str]:
    """The arguments of ``command`` (python -m pytest ...) with ``test_file`` for ``tests``,
    without xdist's: which tests run does not depend on how many processes run them, and
    xdist would start workers that each collect everything again."""
    args, words = [], iter(command[3:])
    for word in words:
        for _ in range(XDIST.get(word, 1) - 1):
            next(words)
        if word not in XDIST:
            args.append(test_file if word == "tests" else word)
    return args


def collect_all(*selections: list[str]) -> list[list[str]]:
    """Each selection's collected lines, in order, from one Python that imports pytest, its
    plugins and the course once (a process each took 7 s of CPU)."""
    done = subprocess.run([sys.executable, "-c", COLLECT, json.dumps(selections)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    for (code, printed), args in zip(found, selections, strict=True):
        assert code == 0, f"pytest {' '.join(args)} --collect-only:\n{printed}"
    return [[line for line in printed.splitlines() if "::" in line] for _, printed in found]


def full_run_here(session) -> list[str] | None:
    """This session's collection, in order, when the session is scripts/test.sh's full run
    (the tests and the notebooks under nbval, none deselected), else None: collecting it again
    in another Python took 10 s of CPU."""
    config = session.config
    if (config.args != ["tests", "notebooks"] or not config.getoption("nbval", False)
            or config.getoption("markexpr") or config.getoption("keyword")
            or config.getoption("deselect")):
        return None
    return [item.nodeid for item in session.items]


@pytest.fixture(scope="module")
def collections(request):
    """What the quick and the unit runs of scripts/test.sh select from a file with slow and
    fast tests, what -m slow selects there, and the full run's collection, in order."""
    some = "tests/test_hang_lab.py"
    quick, unit = pytest_command("--quick"), pytest_command("--unit")
    full = ["-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", "tests",
            "notebooks"]
    here = full_run_here(request.session)
    lists = collect_all(selection(quick, some), selection(unit, some),
                        ["-q", "-p", "no:cacheprovider", "-m", "slow", some],
                        *([full] if here is None else []))
    found = lists if here is None else [*lists, here]
    return some, dict(zip(("quick", "unit", "slow", "full"), found, strict=True))


def test_quick_selects_only_the_tests_not_marked_slow(collections):
    some, found = collections
    fast, every, marked = (set(found[k]) for k in ("quick", "unit", "slow"))
    assert fast and marked and every - fast == marked  # exactly the slow ones are left out
    assert f"{some}::test_every_case_ends_within_seconds" in marked
    assert f"{some}::test_blamed_ranks_are_read_from_monitored_barrier_messages" in fast


def test_selection_drops_only_xdists_options():
    command = ["python", "-m", "pytest", "tests", "-q", "-n", "3", "--dist", "loadfile",
               "--no-loadscope-reorder", "-m", "not slow"]
    assert selection(command, "tests/x.py") == ["tests/x.py", "-q", "-m", "not slow"]


def test_the_full_run_is_one_session_over_the_tests_and_the_notebooks():
    done = bash("scripts/test.sh", "--dry-run", timeout=60)
    runs = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ ")]
    sessions = [cmd for cmd in runs if cmd[:3] == ["python", "-m", "pytest"]]
    assert len(sessions) == 1, done.stdout
    session = sessions[0]
    assert session[3:5] == ["tests", "notebooks"] and "--nbval" in session
    assert "--no-loadscope-reorder" in session  # files handed out in tests/conftest.py's order


def test_narrow_isa_reruns_the_notebooks_with_narrower_kernels_set_first():
    done = bash("scripts/test.sh", "--narrow-isa", "--dry-run", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    exports = [line.split(" ", 1)[1] for line in lines if line.startswith("export ")]
    assert exports == ["ATEN_CPU_CAPABILITY=default", "MKL_ENABLE_INSTRUCTIONS=SSE4_2",
                       "MKL_CBWR=COMPATIBLE", "ONEDNN_MAX_CPU_ISA=SSE41"]
    sessions = [shlex.split(line) for line in lines if line.startswith("python -m pytest")]
    assert len(sessions) == 1 and sessions[0][3] == "notebooks" and "--nbval" in sessions[0]
    first_pytest = next(i for i, line in enumerate(lines) if line.startswith("python -m pytest"))
    assert lines.index("export ONEDNN_MAX_CPU_ISA=SSE41") < first_pytest  # set before the run


def test_the_longest_files_are_collected_first_and_each_exists(collections):
    from suite_order import LONGEST_FIRST, place

    files = list(dict.fromkeys(line.split("::")[0] for line in collections[1]["full"]))
    assert not any(f.endswith(".ipynb") for f in files if f.startswith("tests/"))
    places = [place(f) for f in files]  # in collection order, each file once
    assert places == sorted(places)  # the listed ones first, in the list's order
    assert set(places) >= set(range(len(LONGEST_FIRST)))  # every entry names a file


@pytest.mark.parametrize("system, interface", [(None, LOOPBACK), ("Darwin", "lo0"),
                                               ("Linux", "lo")])
def test_ci_env_names_this_platforms_loopback_interface(system, interface, tmp_path):
    env = {}
    if system is not None:  # a uname that answers as that system would
        fake = tmp_path / "uname"
        fake.write_text(f"#!/bin/sh\necho {system}\n")
        fake.chmod(0o755)
        env["PATH"] = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    done = bash("-c", 'source scripts/ci_env.sh; echo "$GLOO_SOCKET_IFNAME"', env=env)
    assert done.stdout.strip() == interface
