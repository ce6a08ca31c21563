"""The loop around every exercise: hints as a ladder, the answer only on purpose, library code
that an exercise mirrors hidden in student copies until the learner passes."""

import importlib
import inspect
from pathlib import Path

import nbformat
import pytest

from course_lib import check
from course_lib.check import reference
from course_lib.check.checker import LADDERS, exercise, expect, written_ladders
from course_lib.check.exercise_cells import checker_ids
from course_lib.check.student_copy import make_student_copy, shows_an_answer
from course_lib.core import collectives
from course_lib.lessons import show as show_module
from course_lib.runtime import workspace

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "course_lib" / "check"
for module in sorted(CHECK.glob("nb*.py")):  # every checker, so that LADDERS holds every exercise
    importlib.import_module(f"course_lib.check.{module.stem}")
EXERCISES = sorted(LADDERS, key=lambda i: tuple(map(int, i.split("."))))


@pytest.fixture
def student_folder(tmp_path, monkeypatch):
    """A kernel working in a student copy's folder (it holds the copies' manifest)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(workspace.WORKSPACE_ENV, raising=False)
    monkeypatch.delenv(workspace.STUDENT_ENV, raising=False)
    (tmp_path / workspace.STUDENT_MANIFEST).write_text("{}")
    return tmp_path


def code_lines(text: str, longer_than: int = 24) -> set[str]:
    """The lines of code of ``text`` long enough to be the answer, not a common phrase."""
    return {line.strip() for line in text.split("\n") if len(line.strip()) > longer_than
            and not line.strip().startswith(("#", '"', "'"))}


def test_every_exercise_is_collected():
    assert len(EXERCISES) >= 35 and "6.3" in EXERCISES and "11.2" in EXERCISES


@pytest.mark.parametrize("exercise_id", EXERCISES)
def test_every_exercise_has_a_nudge_and_a_pointer_that_give_no_code(exercise_id):
    ladder = LADDERS[exercise_id]
    assert ladder.nudge and ladder.pointer, "write both rungs in course_lib/check/hints.md"
    assert ladder.nudge != ladder.pointer
    answer = reference.reference_answer(exercise_id)
    assert answer, "no reference answer in the notebooks"
    for rung in (ladder.nudge, ladder.pointer):
        leaked = [line for line in code_lines(answer) if line in rung]
        assert not leaked, f"the answer's own lines in a hint: {leaked}"


def test_hints_md_has_one_section_per_exercise_named_after_its_checker():
    text = (CHECK / "hints.md").read_text()
    headings = [line[3:].split(" · ") for line in text.split("\n") if line.startswith("## ")]
    assert [exercise_id for exercise_id, _ in headings] == EXERCISES  # each once, in order
    ids = {exercise_id: f"check.{path.stem}.{name}" for path in sorted(CHECK.glob("nb*.py"))
           for name, exercise_id in checker_ids(path.stem, CHECK).items()}
    assert {exercise_id: shown.strip("`") for exercise_id, shown in headings} == ids
    assert written_ladders() == {i: LADDERS[i] for i in EXERCISES}


def test_the_answer_is_the_reference_notebooks_code_without_markers():
    ring = reference.reference_answer("6.3")
    assert ring.startswith("import") or ring.startswith('"""') or "def ring_all_reduce" in ring
    assert "SOLUTION" not in ring and "%%writefile" not in ring
    function = reference.reference_answer("3.1")
    assert function.lstrip().startswith(("def ", "@")) and "SOLUTION" not in function
    assert reference.reference_answer("42.1") is None


def test_reveal_says_it_gives_the_answer_and_unlocks(student_folder, capsys):
    assert not workspace.is_unlocked("6.3")
    check.reveal("6.3")
    out = capsys.readouterr().out
    assert out.startswith("Exercise 6.3: the course's answer, because you asked for it.")
    assert workspace.is_unlocked("6.3") and not workspace.is_unlocked("6.1")
    check.reveal("six")
    assert "not an exercise number" in capsys.readouterr().out


def test_outside_a_student_copy_everything_is_unlocked_and_nothing_is_written(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(workspace.STUDENT_ENV, raising=False)
    assert workspace.is_unlocked("6.3")
    workspace.unlock("6.3")
    assert not (tmp_path / "workspace").exists()


def displayed(monkeypatch) -> list[str]:
    shown = []
    monkeypatch.setattr(show_module, "display", lambda block: shown.append(block.data))
    return shown


def test_show_hides_an_exercises_answer_until_it_is_passed(student_folder, monkeypatch):
    shown = displayed(monkeypatch)
    show_module.show(collectives.ring_reduce_scatter, exercise="6.3")
    body = inspect.getsource(collectives.ring_reduce_scatter).split('"""')[-1]
    assert "def ring_reduce_scatter(" in shown[0] and '"""' in shown[0]  # signature, docstring
    assert code_lines(body, 12).isdisjoint(code_lines(shown[0], 12))
    assert 'once you pass, or after check.reveal("6.3")' in shown[0]

    monkeypatch.setitem(LADDERS, "99.7", None)  # the made-up exercise is gone after the test

    @exercise("99.7")
    def always(answer):
        expect(True, "")

    workspace.unlock("6.3")  # what a pass of 6.3 does (and the record of its file)
    show_module.show(collectives.ring_reduce_scatter, exercise="6.3")
    assert code_lines(body, 12) <= code_lines(shown[1], 12)


def test_a_pass_in_a_student_copy_unlocks_and_shows_theirs_beside_ours(student_folder,
                                                                        monkeypatch, capsys):
    shown = []
    monkeypatch.setattr(reference, "display", lambda block: shown.append(block.data))
    answer = reference.reference_answer("3.1")
    namespace = {}
    exec(compile(answer.replace("    ", "    ", 1), "<cell>", "exec"), namespace)
    mine = answer + "\n# my own comment\n"
    monkeypatch.setattr(reference, "learner_text", lambda answer: mine)
    reference.show_beside("3.1", object())
    out = capsys.readouterr().out
    assert out.startswith("Yours beside the course's: a diff")
    assert "+# my own comment" in shown[0]


@pytest.mark.parametrize("name, exercise_id", [
    ("05_processes_and_collectives", "5.4"), ("06_all_reduce_from_scratch", "6.3"),
    ("07_data_parallel_training", "7.3"), ("08_bucketing_and_overlap", "8.3"),
    ("10_beyond_data_parallel", "10.4")])
def test_student_copies_drop_the_saved_answers_that_shows_print(name, exercise_id):
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
             and f'exercise="{exercise_id}"' in c.source]
    assert cells and all(nb.cells[i].outputs for i in cells)  # the instructor's copy shows all
    made = make_student_copy(nb, name)
    assert set(cells) <= made.cleared
    for i in cells:
        assert made.notebook.cells[i + 1].outputs == []  # the copy has its note at index 1


def test_shows_an_answer_reads_the_call():
    import ast
    assert shows_an_answer(ast.parse('show(a, b, exercise="6.3")'))
    assert shows_an_answer(ast.parse('show_module.show_file("x.py", exercise="9.3")'))
    assert not shows_an_answer(ast.parse("show(a, b)"))
