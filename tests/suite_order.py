"""The order in which scripts/test.sh's test processes pick up files (tests/conftest.py).

scripts/test.sh runs the unit tests and the notebooks (nbval) in one session on four test
processes, each file or notebook on one process, handed out in collection order. The files
named here take 30 s or more each (2-core CPU, 2026-12-01, in a full run): they come first,
longest first, so that none of them starts last while the other processes sit idle. Only the
suite's speed depends on this list; a file it does not name keeps its place after them.
"""

LONGEST_FIRST = (
    "tests/test_student_notebooks.py",  # 269 s: every student copy, open then answered
    "tests/test_check_file_exercises.py",  # every file exercise's answers, launched
    "tests/browser/", "tests/test_launch.py", "tests/test_scripts.py",
    "tests/test_site.py",  # 30-60 s: the website built once, every page read in Chromium
    "notebooks/06b_",
    "notebooks/08_", "notebooks/07_", "notebooks/09_",
    "notebooks/03_", "tests/test_exercise_cells_00_04.py", "tests/test_notebook_claims_05_07.py",
    "notebooks/10_", "notebooks/05_", "tests/test_notebook_claims_08_10.py",
    "tests/test_check_workspace.py",
    "notebooks/",  # the other notebooks, 5 to about 30 s each
)


def place(test_id: str) -> int:
    """Where the file of ``test_id`` ("tests/x.py::test_y") comes: its entry's index, or last."""
    path = test_id.split("::")[0]
    return next((i for i, start in enumerate(LONGEST_FIRST) if path.startswith(start)),
                len(LONGEST_FIRST))
