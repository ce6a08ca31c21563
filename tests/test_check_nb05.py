"""Notebook 05's checkers: the reference answers pass, realistic wrong answers (a wrong kind of
value, the course's own solution called, a wrong computation) get a short, pointed hint."""

import pytest
from check_reports import shown_report

from course_lib.check.checker import LADDERS
from course_lib.check.nb05 import reduce_scatter_by_hand, two_point_fit
from course_lib.demos.collectives_tour import expected_after
from course_lib.lessons import cost_model


def report_of(checker, answer, hint: str) -> str:
    """What the learner sees for a wrong ``answer``: it names ``hint`` (and is short and free
    of checker code: ``check_reports``)."""
    shown = shown_report(checker, answer)
    assert hint in shown, shown
    return shown


def reference_reduce_scatter(before):
    n = len(before)
    return [[sum(before[src][r] for src in range(n))] for r in range(n)]


def test_reduce_scatter_reference(capsys):
    reduce_scatter_by_hand(reference_reduce_scatter)
    assert capsys.readouterr().out == "Exercise 5.1: correct.\n"


def column_sums(before):
    return [sum(col) for col in zip(*before, strict=True)]


@pytest.mark.parametrize("wrong, hint", [
    (lambda before: [column_sums(before) for _ in before], "that is all-reduce"),
    (lambda before: [[before[r][r]] for r in range(len(before))], "kept its own number"),
    (lambda before: [[column_sums(before)[(r + 1) % len(before)]] for r in range(len(before))],
     "the right sums, on the wrong ranks"),
    (lambda before: [column_sums(before)[r:r + 2] for r in range(len(before))],
     "each rank ends with one number"),
    (lambda before: [[sum(row)] for row in before], "added up its own numbers"),
    (lambda before: column_sums(before), "your code returned the float"),  # no inner lists
    (lambda before: {r: [s] for r, s in enumerate(column_sums(before))},
     "your code returned a dict"),
    (lambda before: expected_after("reduce_scatter", before), "collectives_tour.expected_after"),
])
def test_reduce_scatter_wrong_answers(wrong, hint):
    report_of(reduce_scatter_by_hand, wrong, hint)


def test_reduce_scatter_hints_do_not_give_the_answer_away():
    shown = report_of(reduce_scatter_by_hand, lambda before: [[0.0] for _ in before],
                      "expected")
    assert "sum over ranks of chunk r" not in shown
    assert "column r" in LADDERS["5.1"].pointer


def test_reduce_scatter_not_done(capsys):
    def hole(before):
        raise NotImplementedError("Exercise 5.1")

    reduce_scatter_by_hand(hole)
    assert "Exercise 5.1: not done yet" in capsys.readouterr().out


def reference_fit(n1, t1, n2, t2):
    beta = (t2 - t1) / (n2 - n1)
    return t1 - beta * n1, beta


def library_fit(n1, t1, n2, t2):
    model = cost_model.fit_alpha_beta([n1, n2], [t1, t2])  # the course's own fit: exact here
    return model.alpha_s, model.beta_s_per_byte


def test_the_library_fit_would_give_the_right_numbers():
    """So only the check on the call stops it, not its numbers."""
    fitted = library_fit(1024, 1e-5 + 1024e-9, 2048, 1e-5 + 2048e-9)
    assert fitted == pytest.approx(reference_fit(1024, 1e-5 + 1024e-9, 2048, 1e-5 + 2048e-9))


def test_two_point_fit_reference(capsys):
    two_point_fit(reference_fit)
    assert capsys.readouterr().out == "Exercise 5.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (lambda n1, t1, n2, t2: reference_fit(n1, t1, n2, t2)[::-1], "swapped"),
    (lambda n1, t1, n2, t2: (t1, (t2 - t1) / (n2 - n1)), "take their cost away"),
    (lambda n1, t1, n2, t2: (t1 - t2 / n2 * n1, t2 / n2), "its latency included"),
    (lambda n1, t1, n2, t2: (t1, (t2 - t1) / n2), "how much longer each extra byte"),
    (lambda n1, t1, n2, t2: [t1, t2, n2], "two numbers, not 3"),
    (lambda n1, t1, n2, t2: (t2 - t1) / (n2 - n1), "your code returned the float"),
    (lambda n1, t1, n2, t2: {"alpha": reference_fit(n1, t1, n2, t2)[0]},
     "your code returned a dict"),
    (library_fit, "cost_model.fit_alpha_beta"),
])
def test_two_point_fit_wrong_answers(wrong, hint):
    shown = report_of(two_point_fit, wrong, hint)
    assert "(t2 - t1) / (n2 - n1)" not in shown and "t1 - beta" not in shown
