"""Notebook 05's checkers: the reference answers pass, realistic wrong answers (a wrong kind of
value, the course's own solution called, a wrong computation) get a short, pointed hint."""

import numpy as np
import pytest
from check_reports import shown_report, standard_tests

from course_lib.check.cases import token_ring
from course_lib.check.checker import LADDERS, ExerciseError
from course_lib.check.nb05 import reduce_scatter_by_hand, two_point_fit
from course_lib.lessons import cost_model
from course_lib.lessons.collective_definitions import expected_after


def reference_reduce_scatter(before):
    n = len(before)
    return [[sum(before[src][r] for src in range(n))] for r in range(n)]


def column_sums(before):
    return [sum(col) for col in zip(*before, strict=True)]


REDUCE_SCATTER_BY_HAND_MISTAKES = [
    (lambda before: [column_sums(before) for _ in before], "that is all-reduce"),
    (lambda before: [[before[r][r]] for r in range(len(before))], "kept its own number"),
    (lambda before: [[column_sums(before)[(r + 1) % len(before)]] for r in range(len(before))],
     "the right sums, on the wrong ranks"),
    (lambda before: [column_sums(before)[r:r + 2] for r in range(len(before))],
     "each rank ends with one number"),
    (lambda before: [[sum(row)] for row in before], "added up its own numbers"),
    (lambda before: column_sums(before), "rank 0's is the float"),  # no inner lists
    (lambda before: {r: [s] for r, s in enumerate(column_sums(before))},
     "your code returned a dict"),
    (lambda before: expected_after("reduce_scatter", before),
     "collective_definitions.expected_after"),
]


def test_reduce_scatter_hints_do_not_give_the_answer_away():
    shown = shown_report(reduce_scatter_by_hand, lambda before: [[0.0] for _ in before])
    assert "expected" in shown and "sum over ranks of chunk r" not in shown
    assert "column r" in LADDERS["5.1"].pointer


def reference_fit(n1, t1, n2, t2):
    beta = (t2 - t1) / (n2 - n1)
    return t1 - beta * n1, beta


def solved_with_numpy(n1, t1, n2, t2):  # an array of two
    return np.linalg.solve([[1.0, n1], [1.0, n2]], [t1, t2])


def library_fit(n1, t1, n2, t2):
    model = cost_model.fit_alpha_beta([n1, n2], [t1, t2])  # the course's own fit: exact here
    return model.alpha_s, model.beta_s_per_byte


def test_the_library_fit_would_give_the_right_numbers():
    """So only the check on the call stops it, not its numbers."""
    fitted = library_fit(1024, 1e-5 + 1024e-9, 2048, 1e-5 + 2048e-9)
    assert fitted == pytest.approx(reference_fit(1024, 1e-5 + 1024e-9, 2048, 1e-5 + 2048e-9))


TWO_POINT_FIT_MISTAKES = [
    (lambda n1, t1, n2, t2: reference_fit(n1, t1, n2, t2)[::-1], "swapped"),
    (lambda n1, t1, n2, t2: (t1, (t2 - t1) / (n2 - n1)), "take their cost away"),
    (lambda n1, t1, n2, t2: (t1 - t2 / n2 * n1, t2 / n2), "its latency included"),
    (lambda n1, t1, n2, t2: (t1, (t2 - t1) / n2), "how much longer each extra byte"),
    (lambda n1, t1, n2, t2: [t1, t2, n2], "two numbers, not 3"),
    (lambda n1, t1, n2, t2: (t2 - t1) / (n2 - n1), "your code returned the float"),
    (lambda n1, t1, n2, t2: {"alpha": reference_fit(n1, t1, n2, t2)[0]},
     "your code returned a dict"),
    (library_fit, "cost_model.fit_alpha_beta"),
]


def test_the_token_rings_hints_ask_about_the_order_without_giving_it():
    """The deadlock of every rank sending first is the point of exercise 5.3: the ladder may
    ask what would happen if not every rank sent first, and say where to look, no more."""
    nudge, pointer = LADDERS["5.3"].nudge, LADDERS["5.3"].pointer
    assert "What if not every rank sent first?" in nudge
    assert "order of dist.send and dist.recv" in pointer
    for rung in (nudge, pointer, *LADDERS["5.4"].__dict__.values()):
        assert not any(words in rung for words in ("even", "odd", "% 2", "rank == 0", "clone"))


def ring_summaries(spec, values, is_token=(), token_now=None):
    """What every rank of a token-ring case reports, when rank r returned ``values[r]``."""
    first = token_ring.make_token(spec, 0)
    return {r: {"returned": {"tensor": True, "shape": list(first.shape), "dtype": "float32",
                             "values": v, "is_token": r in is_token},
                "token_changed": token_now is not None and r == 0,
                "token_now": token_now if r == 0 else None, "collectives": [], "library": [],
                "calls": ["recv", "send"], "unwaited": [], "touched": [], "forwarded": [],
                "messages": int(len(values) > 1),
                "bytes_sent": 12 * int(len(values) > 1)}
            for r, v in enumerate(values)}


@pytest.mark.parametrize("ranks, returned, is_token, token_now, hint", [
    (2, lambda t: [t[0], t[0]], (), None,
     "rank 0 got back its own token: it returned a copy of it, or rank 1 sent on the token it "
     "had received instead of its own"),
    (3, lambda t: [t[0], t[0], t[1]], (), None, "rank 0 returned a copy of its own token, not "
                                                "the token it received from rank 2"),
    (1, lambda t: [t[0]], (0,), None, "rank 0 returned the token it was given, the same tensor, "
                                      "not a copy"),
    (2, lambda t: [t[1], t[0]], (), [7.0, 7.0, 7.0],
     "on rank 0 pass_token wrote into the token it was given"),
])
def test_the_token_ring_judge_names_what_each_rank_did(ranks, returned, is_token, token_now,
                                                       hint):
    """Judged without a launch: the ways of going wrong that need no test run of their own."""
    spec = {"name": "case", "shape": [3], "dtype": "float32", "seed": 0, "ranks": ranks}
    tokens = [token_ring.make_token(spec, r).tolist() for r in range(ranks)]
    by_rank = ring_summaries(spec, returned(tokens), is_token, token_now)
    with pytest.raises(ExerciseError) as caught:
        token_ring.judge_case("pass_token", spec, by_rank)
    assert str(caught.value).startswith(hint), caught.value


def test_the_token_ring_judge_refuses_the_other_exercises_calls():
    """A call hidden in a helper function is seen while the file runs (judged here)."""
    spec = {"name": "case", "shape": [3], "dtype": "float32", "seed": 0, "ranks": 2}
    tokens = [token_ring.make_token(spec, r).tolist() for r in range(2)]
    by_rank = ring_summaries(spec, tokens[::-1])
    token_ring.judge_case("pass_token", spec, by_rank)  # right: no error
    with pytest.raises(ExerciseError, match="pass_token_async called recv and send: in "
                                            "exercise 5.4 every message is started with"):
        token_ring.judge_case("pass_token_async", spec, by_rank)


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((reduce_scatter_by_hand, [reference_reduce_scatter],
                    REDUCE_SCATTER_BY_HAND_MISTAKES),
                   (two_point_fit, [reference_fit, solved_with_numpy], TWO_POINT_FIT_MISTAKES,
                    ("(t2 - t1) / (n2 - n1)", "t1 - beta")))
