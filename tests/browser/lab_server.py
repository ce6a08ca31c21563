"""Start and stop a throwaway JupyterLab for the browser test, isolated from the user's own.

Everything JupyterLab writes (settings, workspaces, runtime files, the notebooks it saves) goes
to a temporary folder; the notebooks are copies, so running them never changes the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from course_lib.check.mp.harness import WORLD_SIZES_ENV

# What a learner would otherwise see over the page: the "Jupyter news?" toast.
ALWAYS_DISABLED = ("@jupyterlab/apputils-extension:announcements",)
# Extensions to switch off for a negative check, comma-separated: with
# "@jupyter-widgets/jupyterlab-manager" the widget front-end is gone and the test must fail.
DISABLE_ENV = "COURSE_BROWSER_DISABLE"


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT, no token
    root_dir: Path  # the temporary copy of the notebooks JupyterLab serves
    log_path: Path  # JupyterLab's own log, kept with the screenshots
    process: subprocess.Popen
    disabled: list[str] = field(default_factory=list)  # extensions switched off


def free_port() -> int:
    """A port that was free a moment ago (JupyterLab is told not to try others)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_settings(base: Path, disabled: list[str]) -> dict:
    """Settings and page config for the test; returns the environment that points at them."""
    settings = base / "settings"
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    # every cell stays in the page, or cells outside the viewport could not be checked
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    config = base / "config"
    (config / "labconfig").mkdir(parents=True)
    page_config = {"disabledExtensions": {name: True for name in disabled}}
    (config / "labconfig" / "page_config.json").write_text(json.dumps(page_config))
    return {"JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
            "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
            "JUPYTER_DATA_DIR": str(base / "data"),  # the notebook-signing key goes here
            "IPYTHONDIR": str(base / "ipython")}


def forked_kernel(base: Path) -> dict:
    """The "python3" kernel of the lab, forked from this test process's kernel server
    (tests/kernel_fork.py: torch imported once), when there is one: the environment that
    puts its spec first where Jupyter looks ($JUPYTER_PATH)."""
    from kernel_fork import kernel_spec

    spec = kernel_spec()  # starts the server (and sets its socket's variable) if need be
    if spec is None:
        return {}
    folder = base / "path" / "kernels" / "python3"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec))
    return {"JUPYTER_PATH": str(base / "path")}


def lab_environment(base: Path, repo_root: Path, disabled: list[str]) -> dict:
    """The server's environment; its kernels inherit it, so they see ``course_lib``."""
    forked = forked_kernel(base)
    env = {**os.environ, **forked}
    env.pop("MPLBACKEND", None)  # the kernel must keep matplotlib's inline backend
    # An exercise checker launches the learner's file on 2 processes only, here: the page
    # shows the same line, and nbval runs the same notebooks' checkers on 2, 3 and 4.
    env.setdefault(WORLD_SIZES_ENV, "2")
    env.update(write_settings(base, disabled))
    return env


def lab_command(port: int, root_dir: Path) -> list[str]:
    # sys.executable runs the server, and the "python3" kernel spec resolves to the same python
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           "--ServerApp.ip=127.0.0.1", "--ServerApp.token=", "--ServerApp.password=",
           "--ServerApp.open_browser=False", f"--ServerApp.root_dir={root_dir}",
           "--ServerApp.disable_check_xsrf=True",  # lets the test stop kernels over REST
           "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: the kernel's status
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # CI and containers run as root; JupyterLab refuses else
    return cmd


def wait_until_up(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> bool:
    """True once the server answers; False if it exited (port taken); raises on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s; its log:\n"
                       f"{tail(log_path)}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def start_lab(notebook_dir: Path, extra_notebooks: list[Path], base: Path, repo_root: Path,
              log_path: Path, timeout_s: float = 90) -> LabServer:
    """Serve a copy of ``notebook_dir`` (plus ``extra_notebooks``) on a free port.

    The copy lives in ``base/work``, so what JupyterLab saves never reaches the repository.
    """
    root_dir = base / "work"
    shutil.copytree(notebook_dir, root_dir,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for path in extra_notebooks:
        shutil.copy2(path, root_dir / path.name)
    extra = [x.strip() for x in os.environ.get(DISABLE_ENV, "").split(",") if x.strip()]
    disabled = [*ALWAYS_DISABLED, *extra]
    env = lab_environment(base, repo_root, disabled)
    for _ in range(3):  # the free port can be taken before JupyterLab binds it: try another
        port = free_port()
        with open(log_path, "w") as log:
            process = subprocess.Popen(lab_command(port, root_dir), cwd=root_dir, env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        if wait_until_up(url, process, log_path, timeout_s):
            return LabServer(url, root_dir, log_path, process, extra)
    raise RuntimeError(f"JupyterLab would not start three times; its log:\n{tail(log_path)}")


def shut_down_kernels(url: str) -> None:
    """Stop every kernel the server runs (their launched workers die with them)."""
    try:
        with urllib.request.urlopen(f"{url}/api/sessions", timeout=5) as reply:
            sessions = json.load(reply)
        for session in sessions:
            request = urllib.request.Request(f"{url}/api/sessions/{session['id']}",
                                             method="DELETE")
            urllib.request.urlopen(request, timeout=10).close()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        pass  # the server is gone already; stop_lab ends whatever is left


def stop_lab(server: LabServer, grace_s: float = 10) -> list[psutil.Process]:
    """Stop kernels, then the server, then anything it started; return what survived."""
    try:  # the server, its kernels and what they launched, as they are now
        family = [psutil.Process(server.process.pid)]
        family += family[0].children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    shut_down_kernels(server.url)
    server.process.send_signal(signal.SIGTERM)  # JupyterLab's own clean shutdown
    try:
        server.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=grace_s)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in family if still_running(p)]
        for p in alive:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(alive, timeout=3)
        if not still:
            break
    return [p for p in family if still_running(p)]


def still_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
