"""How long a learner waits for each file exercise's verdict: right, wrong, deadlock.

    python scripts/bench_checkers.py                   # every file exercise, this tree
    python scripts/bench_checkers.py 6.3 10.6          # some of them
    python scripts/bench_checkers.py --before 7c8b431  # and the same answers on that commit

For each exercise it times, on the checkers of the tree it is in (the course's ``course_lib``
beside it, whatever is installed), as a notebook's checker cell runs them (2, 3 and 4 processes, in
a process that has launched before, so its agent server is warm): the notebook's own answer
(called correct), a wrong answer whose mistake is in the values (named), and one whose ranks
wait on each other forever (ended and explained). The answers are the entries of
tests/file_exercises.py (``WRONG`` and ``DEADLOCK``). With ``--before REV`` the same answers
run on the checkers of commit REV too (its files, unpacked with ``git archive`` into a
temporary folder), exercise by exercise in turns, so that both see the same load; the table
gives both times side by side. Each measurement runs in a process of its own; ``--rounds``
takes the median of several; ``--busy N`` keeps N more processes spinning on the CPU
throughout, as other work on a shared laptop would.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("right", "wrong", "deadlock")


def answers(keys: list[str]) -> dict:
    """{exercise: {"entry": (module, function), "file": name, kind: text}} from the spec."""
    sys.path.insert(0, str(ROOT / "tests"))
    from answer_edits import edited, reference
    from file_exercises import DEADLOCK, EXERCISES, WRONG

    found = {}
    for key in keys:
        ex, text = EXERCISES[key], reference(EXERCISES[key].file)
        found[key] = {"entry": [ex.checker.__module__, ex.checker.__name__], "file": ex.file,
                      "right": text, "wrong": edited(text, ex.wrong[WRONG[key]].edits)}
        if key in DEADLOCK:
            found[key]["deadlock"] = edited(text, ex.wrong[DEADLOCK[key]].edits)
    return found


def measure(job: dict) -> dict:
    """In this process: warm the launcher up, then time each answer's verdict."""
    import importlib

    import ipykernel  # noqa: F401 - as in a notebook: every launch forks from the server

    from course_lib.check.checker import ExerciseError
    from course_lib.runtime.launch import launch

    os.chdir(tempfile.mkdtemp(prefix="bench-checkers-"))
    os.makedirs("workspace")
    launch("course_lib.demos.hello", 2, quiet=True)  # the agent server starts here
    module, function = job["entry"]
    checker = getattr(importlib.import_module(module), function)
    times = {}
    for kind in KINDS:
        if kind not in job:
            continue
        with open(f"workspace/{job['file']}", "w") as f:
            f.write(job[kind])
        start = time.monotonic()
        try:
            checker(f"workspace/{job['file']}")
            verdict = "correct"
        except ExerciseError as e:
            verdict = str(e).split("\n")[0][:60]
        times[kind] = [time.monotonic() - start, verdict]
    return times


def run_measure(job: dict, tree: Path) -> dict:
    """``measure`` in a process of its own, on the checkers of ``tree`` (first on the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, __file__, "--measure"], input=json.dumps(job),
                          capture_output=True, text=True, env=env, cwd=tree, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the measurement failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def unpack(rev: str, folder: Path) -> Path:
    """The files of commit ``rev``, unpacked into ``folder``."""
    archive = subprocess.run(["git", "archive", rev, "course_lib"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    path = folder / "archive.tar"
    path.write_bytes(archive)
    with tarfile.open(path) as tar:
        tar.extractall(folder, filter="data")
    return folder


def comparable(then: dict | None) -> bool:
    """The other commit judged the same answers: its checker called the notebook's answer right
    (a checker that refuses it, say for an import it did not allow yet, times something else)."""
    return bool(then) and then.get("right", [0.0, "correct"])[1] == "correct"


def table(results: dict, before: bool) -> list[str]:
    head = "| exercise | " + " | ".join(
        f"{kind} (before)" if before else kind for kind in KINDS) + " |"
    rows, notes = [head, "|" + "---|" * (len(KINDS) + 1)], []
    for key, (now, then) in results.items():
        cells, refused = [], bool(then) and not comparable(then)
        for kind in KINDS:
            new = f"{now[kind][0]:.1f} s" if kind in now else "-"
            old = f" ({then[kind][0]:.1f} s)" if then and not refused and kind in then else ""
            cells.append(new + old + (" (n/a)" if refused else ""))
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
        if refused:
            notes.append(f"n/a: the other commit's checker of {key} refused the notebook's "
                         f"answer (\"{then['right'][1]}...\"), so its times are not comparable")
    return rows + notes


def median_times(runs: list[dict]) -> dict:
    return {kind: [statistics.median(r[kind][0] for r in runs), runs[-1][kind][1]]
            for kind in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exercises", nargs="*", help="exercise ids (default: every one)")
    parser.add_argument("--before", metavar="REV", help="also time the checkers of commit REV")
    parser.add_argument("--rounds", type=int, default=1, help="measurements to take the median of")
    parser.add_argument("--busy", type=int, default=0, help="processes that keep the CPU busy")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.measure:  # a child: one exercise, its answers on stdin
        print(json.dumps(measure(json.loads(sys.stdin.read()))))
        return 0
    sys.path.insert(0, str(ROOT / "tests"))
    from file_exercises import EXERCISES

    jobs = answers(ns.exercises or list(EXERCISES))
    results = {}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(ns.busy)]
    try:
        measure_all(jobs, ns, results)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print("\n".join(table(results, bool(ns.before))))
    return 0


def measure_all(jobs: dict, ns, results: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-before-") as folder:
        old_tree = unpack(ns.before, Path(folder)) if ns.before else None
        for key, job in jobs.items():
            now, then = [], []
            for _ in range(ns.rounds):  # in turns: both see the same load
                now.append(run_measure(job, ROOT))
                if old_tree is not None:
                    then.append(run_measure(job, old_tree))
            results[key] = (median_times(now), median_times(then) if then else None)
            for kind in now[-1]:
                print(f"[time] {key} {kind}: {results[key][0][kind][0]:.1f} s"
                      + (f" (before: {results[key][1][kind][0]:.1f} s, "
                         f"{results[key][1][kind][1][:30]})" if then else "")
                      + f"  {results[key][0][kind][1]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
