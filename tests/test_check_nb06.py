"""Notebook 06's checkers: the reference answers pass, realistic wrong answers get a hint."""

import pytest

from course_lib.check.core import ExerciseError
from course_lib.check.nb06 import reduce_scatter_step, ring_bytes
from course_lib.core.collectives import chunk_bounds


def reference_step(chunks, step):
    n = len(chunks)
    for r in range(n):  # in place is safe: no rank sends the chunk it receives in this step
        c = (r - step - 1) % n
        chunks[(r + 1) % n][c] = chunks[(r + 1) % n][c] + chunks[r][c]
    return chunks


def wrong_chunk(chunks, step):
    n = len(chunks)
    new = [list(row) for row in chunks]
    for r in range(n):
        c = (r - step) % n  # one chunk off: ends with chunk r + 1 on rank r
        new[(r + 1) % n][c] = chunks[(r + 1) % n][c] + chunks[r][c]
    return new


def overwrite(chunks, step):
    n = len(chunks)
    new = [list(row) for row in chunks]
    for r in range(n):
        c = (r - step - 1) % n
        new[(r + 1) % n][c] = chunks[r][c].clone()  # replaces instead of adding
    return new


def to_the_left(chunks, step):
    n = len(chunks)
    new = [list(row) for row in chunks]
    for r in range(n):
        c = (r - step - 1) % n
        new[(r - 1) % n][c] = chunks[(r - 1) % n][c] + chunks[r][c]
    return new


def no_return(chunks, step):
    reference_step(chunks, step)  # right work, but the result is not returned


def test_reduce_scatter_step_reference(capsys):
    reduce_scatter_step(reference_step)
    assert capsys.readouterr().out == "Exercise 6.1: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (wrong_chunk, r"sends chunk \(r - s - 1\) mod N"),
    (overwrite, "must add the incoming chunk"),
    (to_the_left, "to rank \\(r \\+ 1\\) mod N"),
    (no_return, "return the chunks after the step"),
])
def test_reduce_scatter_step_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        reduce_scatter_step(wrong)


def reference_bytes(numel, world_size, element_size):
    sizes = [b - a for a, b in chunk_bounds(numel, world_size)]
    if world_size == 1:
        return [0]
    return [(2 * numel - sizes[r] - sizes[(r + 1) % world_size]) * element_size
            for r in range(world_size)]


def test_ring_bytes_reference(capsys):
    ring_bytes(reference_bytes)
    assert capsys.readouterr().out == "Exercise 6.2: correct.\n"


@pytest.mark.parametrize("wrong, hint", [
    (lambda numel, n, size: [2 * (n - 1) * numel * size // n] * n, "use chunk_bounds"),
    (lambda numel, n, size: [v // size for v in reference_bytes(numel, n, size)],
     "multiply by element_size"),
    (lambda numel, n, size: [2 * numel * size] * n, "every chunk but chunk r"),
    (lambda numel, n, size: 2 * (n - 1) * numel * size / n, "one number per rank"),
])
def test_ring_bytes_wrong_answers(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        ring_bytes(wrong)


def test_not_done(capsys):
    def hole(*args):
        raise NotImplementedError("Exercise 6.x")

    reduce_scatter_step(hole)
    ring_bytes(hole)
    out = capsys.readouterr().out
    assert "Exercise 6.1: not done yet" in out and "Exercise 6.2: not done yet" in out
