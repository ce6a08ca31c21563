"""What a checker launches on N processes: one exercise's cases, run on the learner's file.

    python -m course_lib.runtime.launch --nproc 3 course_lib.check.mp.program \\
        RUN_DIR CASES_MODULE LEARNER_FILE [OPTIONS_JSON]

Each rank joins the process group (``worker``; the checker sets a short
``COURSE_PG_TIMEOUT_S``), installs the ``Tracer``, imports the learner's file, runs every case
of ``CASES_MODULE`` in order (see ``course_lib.check.mp``) and writes ``RUN_DIR/result{R}.json``:

    {"rank": R, "world_size": N, "cases": [one summary per case run],
     "error": null or {"kind", "type", "message", "line", "source", "case", "status"}}

A rank stops at its first error; its peers then stop too (their messages fail or time out).
Every rank exits normally, so the launcher has nothing to say: the checker judges the files.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch.distributed as dist

from course_lib.check.mp.learner import describe_error, load_learner
from course_lib.check.mp.tracer import Tracer
from course_lib.runtime.launch_child import write_json_atomic
from course_lib.runtime.worker import worker


def result_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"result{rank}.json")


def make_groups(specs: list[dict], w) -> dict[int, object]:
    """{size: group of ranks 0 .. size-1}; every rank must create every group, in order."""
    groups = {w.world_size: w.group}
    for size in sorted({spec.get("ranks", w.world_size) for spec in specs}):
        if size not in groups:
            groups[size] = dist.new_group(list(range(size)))
    return groups


def run_cases(cases, specs: list[dict], groups: dict, learner, tracer: Tracer, w,
              options: dict, report: dict, save) -> None:
    for spec in specs:
        size = spec.get("ranks", w.world_size)
        if w.rank >= size:
            continue  # a case for fewer ranks: the others sit it out
        report["case"] = spec["name"]
        dist.barrier(group=groups[size])  # no message of one case can meet one of the next
        report["cases"].append(cases.run_case(learner, spec, groups[size], tracer, options))
        save()  # written after every case: a rank that Gloo kills later keeps its results
    report["case"] = None


def main(argv: list[str] | None = None) -> None:
    run_dir, cases_name, path, *rest = sys.argv[1:] if argv is None else argv
    options = json.loads(rest[0]) if rest else {}
    rank = int(os.environ.get("RANK", "0"))
    tracer = Tracer(run_dir, rank, path)
    report = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
              "cases": [], "case": None, "error": None}

    def save() -> None:
        write_json_atomic(result_path(run_dir, rank), {**report, "finished": False})
    try:
        with worker(seed=0, per_rank_seed=False, backend="gloo") as w:
            cases = importlib.import_module(cases_name)
            specs = cases.case_specs(w.world_size, options)
            groups = make_groups(specs, w)
            tracer.install()
            try:
                learner = load_learner(path)  # the file's top-level code runs here
                run_cases(cases, specs, groups, learner, tracer, w, options, report, save)
            except Exception as e:  # every way the learner's code fails is judged
                report["error"] = {**describe_error(e, path), "case": report["case"],
                                   "status": tracer.last}
    finally:
        write_json_atomic(result_path(run_dir, rank), {**report, "finished": True})


if __name__ == "__main__":
    main()
