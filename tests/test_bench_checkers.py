"""scripts/bench_checkers.py's table: another commit's times stand beside today's only where
that commit's checker judged the same answers (it called the notebook's answer right)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_checkers.py"
spec = importlib.util.spec_from_file_location("bench_checkers", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

NOW = {"right": [2.3, "correct"], "wrong": [0.5, "the SUM"], "deadlock": [2.1, "never finished"]}


def test_times_of_a_checker_that_judged_the_same_answers_stand_side_by_side():
    then = {"right": [2.8, "correct"], "wrong": [0.7, "the SUM"], "deadlock": [10.7, "never"]}
    rows = bench.table({"8.3": (NOW, then)}, before=True)
    assert rows[-1] == "| 8.3 | 2.3 s (2.8 s) | 0.5 s (0.7 s) | 2.1 s (10.7 s) |"


def test_times_of_a_checker_that_refused_the_answer_are_marked_not_comparable():
    refused = {kind: [0.0, "workspace/my_hooks.py imports course_lib.core.buckets"]
               for kind in bench.KINDS}
    rows = bench.table({"8.3": (NOW, refused)}, before=True)
    assert "| 8.3 | 2.3 s (n/a) | 0.5 s (n/a) | 2.1 s (n/a) |" in rows
    assert "0.0 s" not in "\n".join(rows)
    assert rows[-1].startswith("n/a: the other commit's checker of 8.3 refused")
    assert "imports course_lib.core.buckets" in rows[-1]
