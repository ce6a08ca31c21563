"""What a checker launches on N processes: one exercise's cases, run on the learner's file.

    python -m course_lib.runtime.launch --nproc 3 course_lib.check.mp.program \\
        RUN_DIR CASES_MODULE LEARNER_FILE [OPTIONS_JSON]

Each rank joins the process group (``worker``; the checker sets a short
``COURSE_PG_TIMEOUT_S``), installs the ``Tracer``, imports the learner's file, runs every case
of ``CASES_MODULE`` in order (see ``course_lib.check.mp``) and writes ``RUN_DIR/result{R}.json``
(LEARNER_FILE may also be a JSON list of files: the tests' shared launches, ``runner.prelaunch``;
file K then runs in RUN_DIR/K/ as if alone, from fresh seeds, and a rank stops at the first file
that raised on it):

    {"rank": R, "world_size": N, "cases": [one summary per case run],
     "error": null or {"kind", "type", "message", "line", "source", "case", "status"}}

A case runs on the ranks its spec names (``"members"``: global ranks, all of them when absent;
a group such as [1, 2] of 3 processes, where a rank's global number is not its number in the
group); the others sit it out. Each summary gets the rank's number in that group
(``"group_rank"``) and the group's ``"members"``. The cases of a launch are kept apart by a
barrier in a group of every rank that the learner's code never sees.

A rank stops at its first error; its peers then stop too (their messages fail or time out).
Every rank exits normally, so the launcher has nothing to say: the checker judges the files.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys

import torch.distributed as dist

from course_lib.check.mp.learner import describe_error, load_learner
from course_lib.check.mp.tracer import Tracer
from course_lib.runtime.launch_child import write_json_atomic
from course_lib.runtime.worker import seed_everything, worker

CONTROL_TIMEOUT_S = 120.0  # the checker's own barrier: a rank may compute a while before it


def result_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"result{rank}.json")


def members(spec: dict, world_size: int) -> tuple[int, ...]:
    """The global ranks a case runs on."""
    return tuple(spec.get("members", range(world_size)))


def make_groups(specs: list[dict], w) -> dict:
    """{members: group} of every case, and {"control": a group of every rank for the checker's
    own barriers}; every rank makes every group, in the same order."""
    groups = {tuple(range(w.world_size)): w.group}
    for ranks in sorted({members(spec, w.world_size) for spec in specs}):
        if ranks not in groups:
            groups[ranks] = dist.new_group(list(ranks))
    groups["control"] = dist.new_group(list(range(w.world_size)),
                                       timeout=datetime.timedelta(seconds=CONTROL_TIMEOUT_S))
    return groups


def run_cases(cases, specs: list[dict], groups: dict, learner, tracer: Tracer, w,
              options: dict, report: dict, save, run_dir: str) -> None:
    for spec in specs:
        ranks = members(spec, w.world_size)
        tracer.barrier()  # no message of one case meets one of the next
        if w.rank not in ranks:
            continue  # a case for other ranks: this one sits it out
        report["case"] = spec["name"]
        group = groups[ranks]
        summary = cases.run_case(learner, spec, group, tracer, {**options, "run_dir": run_dir})
        report["cases"].append({**summary, "name": spec["name"], "members": list(ranks),
                                "group_rank": dist.get_rank(group)})
        save()  # written after every case: a rank that Gloo kills later keeps its results
    report["case"] = None


def run_learner(path: str, run_dir: str, cases, specs, groups, tracer: Tracer, w,
                options: dict) -> bool:
    """Run every case on one learner's file, as a launch of its own would; write
    RUN_DIR/result{R}.json. Returns whether it ran without an error on this rank."""
    report = {"rank": w.rank, "world_size": w.world_size, "cases": [], "case": None,
              "error": None}

    def save(finished: bool = False) -> None:
        write_json_atomic(result_path(run_dir, w.rank), {**report, "finished": finished})
        tracer.publish_status()  # the status beside it (the result first: a rank Gloo ends
        # at this moment keeps what it found)

    tracer.retarget(run_dir, path, report)
    seed_everything(0)  # as worker(seed=0) left the generators for a launch of its own
    folder = os.path.dirname(os.path.abspath(path))
    try:
        learner = load_learner(path)  # the file's top-level code runs here
        run_cases(cases, specs, groups, learner, tracer, w, options, report, save, run_dir)
    except Exception as e:  # every way the learner's code fails is judged
        report["error"] = {**describe_error(e, path), "case": report["case"],
                           "status": tracer.last}
    finally:
        for name in [name for name, module in list(sys.modules.items())
                     if os.path.dirname(getattr(module, "__file__", None) or "") == folder]:
            del sys.modules[name]  # the file and its neighbours: the next file has its own
        save(finished=True)
    return report["error"] is None


def main(argv: list[str] | None = None) -> None:
    run_dir, cases_name, learners, *rest = sys.argv[1:] if argv is None else argv
    options = json.loads(rest[0]) if rest else {}
    shared = learners.startswith("[")  # a JSON list of files: a shared launch
    paths = json.loads(learners) if shared else [learners]
    rank = int(os.environ.get("RANK", "0"))
    tracer = Tracer(run_dir, rank, paths[0])
    done = 0
    try:
        with worker(seed=0, per_rank_seed=False, backend="gloo") as w:
            cases = importlib.import_module(cases_name)
            specs = cases.case_specs(w.world_size, options)
            groups = make_groups(specs, w)
            tracer.control = groups["control"]
            tracer.install(w.world_size)
            for k, path in enumerate(paths):
                folder = os.path.join(run_dir, str(k)) if shared else run_dir
                os.makedirs(folder, exist_ok=True)
                done = k + 1
                if not run_learner(path, folder, cases, specs, groups, tracer, w, options):
                    break  # its peers may still wait in it: the files after it run alone
    finally:
        if done == 0:  # stopped before any file ran (the process group, say)
            write_json_atomic(result_path(run_dir, rank),
                              {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                               "cases": [], "case": None, "error": None, "finished": True})


if __name__ == "__main__":
    main()
