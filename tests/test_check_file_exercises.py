"""Every file exercise (its entry in tests/file_exercises.py), checked as a learner's
workspace/NAME.py: the reference passes and its pass is recorded; other right answers pass; the
skeleton is "not done yet" without a launch; each wrong answer gets the hint that names its
mistake (a short report, no checker code) and no other entry's words; an answer that calls the
library's own solution is refused before any launch. Answers that run every case to the end
share one launch per world size and exercise (tests/shared_launch.py)."""

import re

import pytest
from answer_edits import edited, reference, skeleton, with_lines
from check_reports import checked_lines, file_hint
from file_exercises import EXERCISES, MAIN
from shared_launch import share_launches

from course_lib.check.checker import ExerciseError, passed_line
from course_lib.check.mp import harness, runner, verdict
from course_lib.runtime.launch import launch
from course_lib.runtime.workspace import has_passed

RIGHT = [(key, name) for key, ex in EXERCISES.items() for name in ex.right]
WRONG = [pytest.param(key, name, marks=[pytest.mark.slow] if wrong.size else [])
         for key, ex in EXERCISES.items() for name, wrong in ex.wrong.items()]
LIBRARY = [(key, name) for key, ex in EXERCISES.items() for name in ex.library]


@pytest.fixture(scope="module")
def shared():
    """``shared(key)``: once per exercise, one launch per world size for every answer of it
    that runs to the end (the reference, the right ones, the wrong ones marked shared)."""
    done = set()

    def share(key: str) -> None:
        if key in done:
            return
        done.add(key)
        ex, text = EXERCISES[key], reference(EXERCISES[key].file)
        answers = [(text, ex.reference_size)]
        answers += [(edited(text, r.edits), r.size) for r in ex.right.values() if r.shared]
        answers += [(edited(text, w.edits), w.size) for w in ex.wrong.values() if w.shared]
        share_launches(ex.declared.cases, ex.file, answers, ex.declared.options)

    return share


@pytest.fixture
def no_launch(monkeypatch):
    """Fail a test that launches processes: its verdict must come from reading the file."""
    monkeypatch.setattr(runner, "launch", lambda *a, **k: pytest.fail("it launched"))


def printed(key: str, lines) -> str:
    return "".join(f"{line}\n" for line in (*lines, passed_line(key)))


@pytest.mark.slow
@pytest.mark.parametrize("key", EXERCISES)
def test_the_reference_passes_and_is_recorded(workspace, capsys, shared, key):
    """On one world size (3, or 4 for a group of ranks [1, 3]); the notebook's own checker
    cell, which nbval runs, checks it on 2, 3 and 4."""
    ex = EXERCISES[key]
    shared(key)
    path = workspace.put(reference(ex.file), ex.file)
    ex.checker(path, world_sizes=(ex.reference_size,))
    assert capsys.readouterr().out == printed(key, ex.prints)
    assert has_passed(key, path)


@pytest.mark.slow
@pytest.mark.parametrize("key, name", RIGHT)
def test_another_right_answer_passes(workspace, capsys, shared, key, name):
    ex, right = EXERCISES[key], EXERCISES[key].right[name]
    shared(key)
    path = workspace.put(edited(reference(ex.file), right.edits), ex.file)
    ex.checker(path, world_sizes=(right.size,))
    assert capsys.readouterr().out == printed(key, right.prints)
    assert has_passed(key, path)


@pytest.mark.parametrize("key", EXERCISES)
def test_the_skeleton_is_not_done_yet_without_a_launch(workspace, capsys, no_launch, key):
    ex = EXERCISES[key]
    ex.checker(workspace.put(skeleton(ex.file), ex.file))
    assert capsys.readouterr().out.startswith(f"Exercise {key}: not done yet")


def named(ex, name: str, hint: str) -> list[str]:
    """The other answers of the exercise whose words the hint says, whatever their line
    numbers: the hint of ``name`` must name none."""
    return [other for other, answer in {**ex.wrong, **ex.library}.items() if other != name
            and all(re.search(r"\d+".join(map(re.escape, re.split(r"\{line:[^}]*\}", words))),
                              hint) for words in answer.said)]


def hint_of(ex, name: str, text: str, size, workspace) -> str:
    """The hint the answer ``text`` gets on ``size`` processes: no pass recorded, a short
    report without a line of the checkers' code, the answer's words and no other's."""
    wrong = {**ex.wrong, **ex.library}[name]
    path = workspace.put(text, ex.file)
    hint = file_hint(ex.checker, path, world_sizes=(size or 2,))
    checked_lines(ExerciseError(hint), harness, verdict,
                  __import__(ex.declared.cases, fromlist=["_"]))
    for words in wrong.said:
        assert with_lines(words, text) in hint, hint
    assert not named(ex, name, hint), hint
    assert not [words for words in wrong.never if words in hint], hint
    return hint


@pytest.mark.parametrize("key, name", WRONG)
def test_a_wrong_answer_gets_the_hint_of_its_mistake_only(workspace, shared, key, name):
    ex, wrong = EXERCISES[key], EXERCISES[key].wrong[name]
    if wrong.shared:
        shared(key)
    hint = hint_of(ex, name, edited(reference(ex.file), wrong.edits), wrong.size, workspace)
    if wrong.size is None:
        assert "launched" not in hint, hint
    elif ex.says_where:
        assert f"launched on {wrong.size} process" in hint, hint


@pytest.mark.parametrize("key, name", LIBRARY)
def test_the_librarys_own_solution_is_refused_before_any_launch(workspace, no_launch, key, name):
    ex = EXERCISES[key]
    hint = hint_of(ex, name, edited(reference(ex.file), ex.library[name].edits), None,
                   workspace)
    assert hint.startswith(f"workspace/{ex.file} uses "), hint


@pytest.mark.slow
@pytest.mark.parametrize("key", MAIN)
def test_the_reference_runs_unchanged_under_torchrun(workspace, key):
    """Its ``__main__`` block (``launch`` runs torchrun's agent, forked from a process that
    imported torch once; test_check_workspace.py runs a file under a plain torchrun)."""
    nproc, patterns = MAIN[key]
    ex = EXERCISES[key]
    out = launch(workspace.put(reference(ex.file), ex.file), nproc=nproc, timeout_s=120,
                 quiet=True).output
    for pattern in patterns:
        found = re.findall(pattern, out)  # the ranks' lines may interleave
        assert len(found) == nproc, out
        assert not re.compile(pattern).groups or len(set(found)) == 1, out  # they agree
