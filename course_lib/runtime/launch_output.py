"""What ``course_lib.runtime.launch`` watches while a run goes on: rank logs, progress, exits,
processes.

Each rank writes ``rank{R}.log`` and, when it ends by itself, ``rank{R}.exit`` in the run's
folder (see ``course_lib.runtime.launch_child``); these helpers read them.
"""

from __future__ import annotations

import glob
import linecache
import os
import re
import signal
import sysconfig
import time

from course_lib.runtime.files import read_json, read_text
from course_lib.runtime.process_tree import running

STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
PACKAGES = re.compile(r"/(?:site|dist)-packages/")  # where pip (or Debian, as on Colab) installs
LAUNCHER_FILES = ("launch_child.py", "agent.py", "agent_server.py", "runpy.py")  # not the rank's


class RankLogs:
    """Follow every rank's log file and echo each complete line as ``[rank R] line``."""

    def __init__(self, run_dir: str, nproc: int, echo: bool = True):
        self.run_dir, self.nproc, self.echo = run_dir, nproc, echo
        self.offsets = [0] * nproc
        self.partial = [""] * nproc
        self.lines: list[list[str]] = [[] for _ in range(nproc)]
        self.all_lines: list[str] = []

    def _read_new(self, rank: int) -> str:
        path = os.path.join(self.run_dir, f"rank{rank}.log")
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[rank])
                data = f.read()
        except FileNotFoundError:
            return ""
        self.offsets[rank] += len(data)
        return data.decode("utf-8", errors="replace")

    def pump(self, final: bool = False) -> None:
        """Echo the lines written since the last call; with ``final``, half lines too."""
        for rank in range(self.nproc):
            text = self.partial[rank] + self._read_new(rank)
            *complete, rest = text.split("\n")
            if final and rest:
                complete, rest = complete + [rest], ""
            self.partial[rank] = rest
            for line in complete:
                self.lines[rank].append(line)
                shown = f"[rank {rank}] {line}"
                self.all_lines.append(shown)
                if self.echo:
                    print(shown, flush=True)

    def text(self) -> str:
        return "\n".join(self.all_lines)

    def empty(self) -> bool:
        return not self.all_lines

    def tails(self, ranks=None, n: int = 15) -> str:
        """The last ``n`` lines of each rank in ``ranks`` (all ranks when None)."""
        ranks = range(self.nproc) if ranks is None else ranks
        parts = []
        for rank in ranks:
            tail = self.lines[rank][-n:] or ["(no output)"]
            parts.append("\n".join(f"  [rank {rank}] {line}" for line in tail))
        return "\n".join(parts)

    def ranks_without_exit(self) -> list[int]:
        return [r for r in range(self.nproc)
                if not os.path.exists(os.path.join(self.run_dir, f"rank{r}.exit"))]

    def where_stopped(self, ranks) -> str:
        """For each rank in ``ranks``, where it was when it was stopped (the stack it wrote on
        SIGTERM): the package call it was inside, if any, then its own frames, innermost first,
        without torch's, Python's and the launcher's."""
        parts = []
        for rank in ranks:
            stack = read_text(os.path.join(self.run_dir, f"rank{rank}.stack"))
            frames = [*library_call(stack), *own_frames(stack)[:3]]
            where = ("\n".join(f"  [rank {rank}] {f}" for f in frames) if frames
                     else f"  [rank {rank}] (no stack: it had not started its code)")
            parts.append(f"Rank {rank} was still running, at:\n{where}")
        return "\n".join(parts)


def main_frames(stack_text: str) -> list[str]:
    """The frames of the rank's main thread (the one in ``run_worker``) from a faulthandler
    dump, innermost first."""
    for block in stack_text.split("\n\n"):
        lines = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
        if any(line.endswith("in run_worker") for line in lines):
            return lines
    return []


def own_frames(stack_text: str) -> list[str]:
    """The main thread's frames without those of torch, of Python itself and of the launcher."""
    return [_with_source(line) for line in main_frames(stack_text) if not _library_frame(line)]


def library_call(stack_text: str) -> list[str]:
    """The innermost frame, when it is a package's (what the rank waited in, such as
    ``torch/distributed/distributed_c10d.py, in all_reduce``): one line, or none."""
    frames = main_frames(stack_text)
    path, line = _path_and_line(frames[0]) if frames else ("", 0)
    inside = PACKAGES.split(path, maxsplit=1)
    if len(inside) < 2:
        return []
    function = frames[0].rsplit(" in ", 1)[-1]
    return [f"inside {inside[1]}, in {function} (line {line})"]


def _path_and_line(frame: str) -> tuple[str, int]:
    match = re.match(r'File "(.*)", line (\d+)', frame)
    return (match[1], int(match[2])) if match else ("", 0)


def _library_frame(frame: str) -> bool:
    path, _ = _path_and_line(frame)
    return (not path or path.startswith("<") or PACKAGES.search(path) is not None
            or path.startswith(STDLIB) or path.endswith(LAUNCHER_FILES))


def _with_source(frame: str) -> str:
    source = linecache.getline(*_path_and_line(frame)).strip()
    return f"{frame}: {source}" if source else frame


class Progress:
    """A progress bar fed by ``report_progress`` in rank 0: a widget in a notebook, else lines."""

    def __init__(self, path: str, enabled: bool = True):
        self.path, self.enabled = path, enabled
        self.last = None
        self.widget = None
        self.handle = None  # the widget's place in the cell's output, to replace at the end
        self.last_print = 0.0

    def update(self) -> None:
        if not self.enabled:
            return
        state = read_json(self.path)
        if state is None or state == self.last:
            return
        self.last = state
        if self.widget is None and _in_notebook():
            self.widget, self.handle = _make_widget()
        if self.widget is not None:
            self.widget.max = max(1, int(state["total"]))
            self.widget.value = int(state["done"])
            self.widget.description = str(state.get("label", ""))[:20]
        elif time.monotonic() - self.last_print > 2 or state["done"] >= state["total"]:
            self.last_print = time.monotonic()
            print(f"[progress] {state['done']}/{state['total']} {state.get('label', '')}",
                  flush=True)

    def close(self) -> None:
        """The last state; in a notebook the bar goes away once the run got to the end (a
        saved notebook shows results, not progress), and a run that stopped early leaves one
        line that says how far it got, rather than an empty widget."""
        self.update()
        if self.widget is not None and self.last is not None:
            self.widget.close()
            done, total = self.last["done"], self.last["total"]
            line = f"[progress] {done}/{total} {self.last.get('label', '')}".strip()
            self.handle.update({"text/plain": "" if done >= total else line}, raw=True)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell is not None and "IPKernelApp" in shell.config
    except ImportError:
        return False


def _make_widget():
    try:
        import ipywidgets
        from IPython.display import display
    except ImportError:
        return None, None
    bar = ipywidgets.IntProgress(min=0, max=1, value=0, description="")
    return bar, display(bar, display_id=True)


# Errors a rank raises because ANOTHER rank died: the culprit is elsewhere.
SECONDARY_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "remote worker crash", "pair closure", "Socket closed",
                    "NCCL communicator was aborted")


class RankWatch:
    """Which rank failed first: one that raised or exited non-zero (it wrote ``rank{R}.exit``),
    or one killed by a signal (its process vanished without writing it)."""

    def __init__(self, run_dir: str, nproc: int):
        self.run_dir, self.nproc = run_dir, nproc
        self.vanished: dict[int, float] = {}  # rank -> when its process was first seen gone
        self.finished: set[int] = set()

    def _path(self, rank: int, kind: str) -> str:
        return os.path.join(self.run_dir, f"rank{rank}.{kind}")

    def poll(self) -> None:
        """Look at every rank's process once; call it often while the run goes on."""
        for rank in range(self.nproc):
            if rank in self.vanished or rank in self.finished:
                continue
            if os.path.exists(self._path(rank, "exit")):
                self.finished.add(rank)
                continue
            try:
                with open(self._path(rank, "pid")) as f:
                    pid = int(f.read().strip() or 0)
            except (FileNotFoundError, ValueError):
                continue
            if pid and not running(pid) and not os.path.exists(self._path(rank, "exit")):
                self.vanished[rank] = time.time()

    def _exits(self) -> list[tuple[float, int, int, bool]]:
        found = []
        for path in glob.glob(os.path.join(self.run_dir, "rank*.exit")):
            info = read_json(path)
            if info is None:
                continue
            if info.get("code", 0) != 0:
                secondary = any(s in (info.get("error") or "") for s in SECONDARY_ERRORS)
                found.append((info.get("time", 0.0), info["rank"], info["code"], secondary))
        return found

    def failure(self, agent_log_path: str):
        """``(rank, exit_code)`` of the rank that failed first, or None while none has.
        ``exit_code`` is negative for a signal (-9: SIGKILL), None when unknown."""
        exits = self._exits()
        primary = [(t, r, c) for t, r, c, secondary in exits if not secondary]
        primary += [(t, r, _agent_exit_code(agent_log_path, r)) for r, t in self.vanished.items()]
        candidates = primary or [(t, r, c) for t, r, c, _ in exits]
        if candidates:
            # Once a rank fails, torchrun stops the others (SIGTERM): seen gone in the same look,
            # they report no exit code of their own (or -15); the rank that failed has one
            _, rank, code = min(candidates, key=lambda c: (c[2] in (None, -signal.SIGTERM),
                                                           c[0], c[1]))
            return rank, code
        return _agent_root_cause(agent_log_path)


def _agent_exit_code(agent_log_path: str, rank: int):
    """The exit code torchrun reported for ``rank`` (negative: a signal), or None."""
    found = re.search(rf"rank\s*:\s*{rank}\b[^\n]*\n\s*exitcode\s*:\s*(-?\d+)",
                      read_text(agent_log_path))
    return int(found.group(1)) if found else None


def _agent_root_cause(agent_log_path: str):
    """The rank torchrun's own report names as the root cause, or None."""
    root = read_text(agent_log_path).split("Root Cause", 1)
    if len(root) == 2:
        rank = re.search(r"rank\s*:\s*(\d+)", root[1])
        code = re.search(r"exitcode\s*:\s*(-?\d+)", root[1])
        if rank:
            return int(rank.group(1)), int(code.group(1)) if code else None
    return None
