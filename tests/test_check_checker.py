"""The checkers' shared mechanism: short reports, type helpers, second hints, missing names."""

import pytest
import torch
from check_reports import ANSI, rendered, report_of
from notebook_kernel import errors, fresh_kernel, stdout

import course_lib.check.nb03 as nb03
from course_lib import check
from course_lib.check import answers, checker, report
from course_lib.check.checker import LADDERS, ExerciseError, Ladder, LearnerCodeError, exercise


def test_a_wrong_answer_shows_its_hint_and_no_checker_code():
    lines = report_of(nb03.uneven_weights, lambda sizes: [1 / len(sizes)] * len(sizes))
    assert lines[0] == "Exercise 3.3: not right yet."
    assert "a smaller one should count for less" in " ".join(lines)


def test_an_error_in_the_learners_code_shows_the_learners_line():
    def my_weights(sizes):
        half = len(sizes) / 2
        return [sizes[half] for _ in sizes]  # a float index: TypeError

    lines = report_of(nb03.uneven_weights, my_weights)
    assert lines[0] == "Exercise 3.3: your code raised an error."
    assert lines[1] == "while running my_weights([4, 4, 2])"
    assert lines[2].endswith("in my_weights")
    assert lines[3].strip() == "return [sizes[half] for _ in sizes]  # a float index: TypeError"
    assert lines[4].startswith("TypeError: list indices must be integers")


def test_an_unusable_return_value_is_reported_not_crashed_on(monkeypatch):
    monkeypatch.setitem(LADDERS, "99.4", None)  # removed again after the test

    @exercise("99.4")
    def halves(answer):  # a checker that trusts the answer to be a number
        checker.expect(float(answer()) == 0.5, "half of one is not that")

    # this file is not course_lib: let no frame count as the learner's, as for a real checker
    monkeypatch.setattr(report, "is_learner_file", lambda filename: False)

    lines = report_of(halves, lambda: None)
    assert "could not use what your code returned" in " ".join(lines)
    assert "ends without `return` gives None" in " ".join(lines)
    lines = report_of(halves, lambda: [0.5])
    assert "(TypeError: float() argument must be" in " ".join(lines)
    assert "check the kind of value it returns" in " ".join(lines)


def test_a_name_missing_in_the_learners_code_says_run_from_the_top():
    def my_accumulate(model, x, y, accum_steps):
        return undefined_loss_function(model(x), y)  # noqa: F821 - the missing name

    lines = report_of(nb03.accumulate, my_accumulate)
    name_line = lines.index("NameError: name 'undefined_loss_function' is not defined")
    assert " ".join(lines[name_line + 1:-1]) == report.RUN_FROM_THE_TOP
    assert lines[-1] == 'Stuck? check.hint("3.1") gives a nudge.'


def test_reports_stay_short():
    long_hint = ExerciseError("word " * 400)
    long_hint.exercise_id = "9.9"
    assert len(rendered(long_hint)) == report.MAX_LINES
    assert rendered(long_hint)[-1].endswith(" ...")

    def deep(n):
        if n == 0:
            return [][1]  # IndexError ten calls down
        return deep(n - 1)  # the same line again and again counts once

    with pytest.raises(LearnerCodeError) as caught:
        answers.call(deep, 10)
    lines = rendered(caught.value)
    assert len(lines) <= report.MAX_LINES
    assert lines[1] == "while running deep(10)" and lines[-1].startswith("IndexError")
    assert sum("in deep" in line for line in lines) == report.MAX_FRAMES


def test_right_and_open_answers_print_one_line_and_return_none(capsys):
    assert nb03.uneven_weights(lambda sizes: [n / sum(sizes) for n in sizes]) is None
    assert capsys.readouterr().out == "Exercise 3.3: correct.\n"

    def still_open(sizes):
        raise NotImplementedError("Exercise 3.3: replace this line with your code")

    assert nb03.uneven_weights(still_open) is None
    assert capsys.readouterr().out == checker.not_done_line("3.3") + "\n"


def test_a_learners_file_still_open_in_a_run_is_not_done_yet(monkeypatch, capsys):
    monkeypatch.setitem(LADDERS, "99.3", None)  # removed again after the test

    @exercise("99.3")
    def ring_file(output):
        checker.raise_if_not_done(output)
        checker.expect("sum = 6" in output, "rank 0 should print the sum")

    ring_file("[rank 1] NotImplementedError: Exercise 99.3: replace this line with your code")
    assert capsys.readouterr().out == checker.not_done_line("99.3") + "\n"
    ring_file("[rank 0] sum = 6")
    assert capsys.readouterr().out == "Exercise 99.3: correct.\n"


def test_expect_type():
    answers.expect_type([0.5, 0.5], (list, tuple), "return a list of weights")
    with pytest.raises(ExerciseError, match="return a list of weights; your code returned None"):
        answers.expect_type(None, (list, tuple), "return a list of weights")
    with pytest.raises(ExerciseError, match="returned the bool True"):
        answers.expect_type(True, int, "return a whole number")
    answers.expect_type(True, (bool, int), "return a flag")
    with pytest.raises(ExerciseError, match=r"a tensor of shape \(2, 3\)"):
        answers.expect_type(torch.zeros(2, 3), float, "return a number")


def test_expect_tensor_with_grad():
    w = torch.ones(3, requires_grad=True)
    answers.expect_tensor_with_grad((w * 2).sum(), "return the loss")
    with pytest.raises(ExerciseError, match=r"plain number 6\.0.*no \.item\(\)"):
        answers.expect_tensor_with_grad((w * 2).sum().item(), "return the loss")
    with pytest.raises(ExerciseError, match="cut off from the model"):
        answers.expect_tensor_with_grad((w * 2).sum().detach(), "return the loss")
    with pytest.raises(ExerciseError, match="not a tensor"):
        answers.expect_tensor_with_grad("loss", "return the loss")


def test_call_reports_the_call_and_lets_an_open_exercise_through():
    assert answers.call(lambda a, b=1: a + b, 1, b=2) == 3

    def my_weights(sizes):
        return sizes[0.5]

    with pytest.raises(LearnerCodeError) as caught:
        answers.call(my_weights, [4, 4, 2])
    assert caught.value.during == "my_weights([4, 4, 2])"
    assert isinstance(caught.value.__cause__, TypeError)
    with pytest.raises(NotImplementedError):
        answers.call(lambda: (_ for _ in ()).throw(NotImplementedError("open")))


def test_the_hint_ladder_a_nudge_then_a_pointer_then_the_reveal(monkeypatch, capsys):
    monkeypatch.setitem(LADDERS, "99.1", None)  # removed again after the test
    monkeypatch.setattr(check.hints, "ASKED", {})

    @exercise("99.1", nudge="what is the mean over?",
              pointer="divide by the number of examples, not of batches")
    def halves(answer):
        checker.expect(answer == 0.5, "half of one is not that")

    check.hint("99.1")
    first = capsys.readouterr().out
    assert first.startswith("Exercise 99.1, hint 1 of 2: what is the mean over?\n")
    assert 'Ask again, check.hint("99.1"), for a pointer' in first
    for _ in range(2):  # the second call and any after it
        check.hint("99.1")
        second = capsys.readouterr().out
        assert second.startswith("Exercise 99.1, hint 2 of 2: divide by the number of "
                                 "examples, not of batches\n")
        assert 'check.reveal("99.1") shows the course\'s answer' in second
    with pytest.raises(ExerciseError) as caught:
        halves(0.25)
    assert rendered(caught.value)[-1] == 'Stuck? check.hint("99.1") gives a nudge.'
    assert "There is no exercise 99.2. The exercises of notebook 99 are: 99.1." \
        == check.hints.hint_text("99.2")


def test_hint_finds_a_notebooks_module_and_explains_unknown_ids():
    assert "3.3" in LADDERS  # nb03 is imported above
    assert check.hints.hint_text("3.3").startswith("Exercise 3.3, hint 1 of 2: ")
    assert check.hints.hint_text("3.3", 2).startswith("Exercise 3.3, hint 2 of 2: ")
    assert check.hints.hint_text("3.9") == ("There is no exercise 3.9. The exercises of "
                                            "notebook 03 are: 3.1, 3.2, 3.3.")
    assert check.hints.hint_text("42.1") == "There is no exercise 42.1: notebook 42 has none."
    assert "not an exercise number" in check.hints.hint_text("three")
    assert check.hints.hint_text("06.2").startswith("Exercise 6.2, hint 1 of 2: ")


def test_needs_outside_ipython():
    rows = [1]  # noqa: F841 - looked up by name
    check.needs(rows="section 4")
    with pytest.raises(check.MissingNameError, match=r"timeline \(from section 4\)"):
        check.needs(rows="section 4", timeline="section 4")
    assert check.install_name_error_help() is False  # no IPython shell here


def test_in_a_real_kernel(tmp_path):
    right = "[n / sum(sizes) for n in sizes]"
    with fresh_kernel(tmp_path) as kernel:
        assert not kernel.run("from course_lib import check\nimport course_lib.check.nb03").failed
        cell = kernel.run("x = 1\nprint(F.relu(x))")
        assert cell.failed and errors(cell)[0].traceback == [
            "\x1b[1mNameError: name 'F' is not defined\x1b[0m", report.RUN_FROM_THE_TOP]
        cell = kernel.run("def my_weights(sizes):\n    return [n / totl for n in sizes]\n\n"
                          "check.nb03.uneven_weights(my_weights)")
        lines = [ANSI.sub("", line) for line in errors(cell)[0].traceback]
        assert cell.failed and len(lines) <= report.MAX_LINES
        assert lines[1:4] == ["while running my_weights([4, 4, 2])",
                              "  Cell In[3], line 2, in my_weights",
                              "    return [n / totl for n in sizes]"]
        assert lines[4] == "NameError: name 'totl' is not defined"
        cell = kernel.run("check.nb03.uneven_weights(lambda sizes: [1] * len(sizes))")
        assert cell.failed and "add up to" in ANSI.sub("", "".join(errors(cell)[0].traceback))
        cell = kernel.run(f"check.nb03.uneven_weights(lambda sizes: {right})")
        assert not cell.failed and [o.output_type for o in cell.outputs] == ["stream"]
        assert stdout(cell) == "Exercise 3.3: correct.\n"
        cell = kernel.run('check.needs(rows="section 4 (the timeline)")')
        assert cell.failed and "rows is not defined yet; it comes from section 4 (the " \
            "timeline)" in ANSI.sub("", errors(cell)[0].traceback[0])
        assert stdout(kernel.run('print("still running")')) == "still running\n"


def test_a_launched_files_error_shows_where_their_line_the_exception_and_the_hint_apart(
        monkeypatch):
    monkeypatch.setitem(LADDERS, "99.6", Ladder("a nudge", "a pointer"))
    message = ("rank 1, workspace/my_ring.py line 12, in ring_all_reduce:\n"
               "    chunks = torch.tensor_split(flat, n)[rank + 1]\n"
               "IndexError: tuple index out of range\n"
               "(case: 12 float32 numbers; launched on 2 processes)\n"
               "tensor_split(flat, N) gives N chunks: the index must stay below N, whatever "
               "the rank; count the chunks you ask for at the last rank and at the first.")
    error = ExerciseError(message, raised=True)
    error.exercise_id = "99.6"
    lines = rendered(error)
    assert lines[:5] == ["Exercise 99.6: your code raised an error.",
                         "rank 1, workspace/my_ring.py line 12, in ring_all_reduce:",
                         "    chunks = torch.tensor_split(flat, n)[rank + 1]",
                         "IndexError: tuple index out of range",
                         "(case: 12 float32 numbers; launched on 2 processes)"]
    assert lines[5].startswith("tensor_split(flat, N) gives N chunks") and len(lines) == 8
    assert lines[7] == 'Stuck? check.hint("99.6") gives a nudge.'
    raw = error._render_traceback_()
    assert raw[3] == "\x1b[1mIndexError: tuple index out of range\x1b[0m"  # bold, no colour
    assert not [line for line in raw if "\x1b[3" in line]  # no ANSI colour on the pink
