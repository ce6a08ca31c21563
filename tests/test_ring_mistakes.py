"""The ring simulator behind exercise 6.3's hints: right indices give the sum, and each known
mistake is named from what it produces (no processes started)."""

import pytest
import torch

from course_lib.check.mp.ring_mistakes import mistake_hint, name_mistake, simulate


def inputs(n: int, numel: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n * 100 + numel)
    return [torch.randint(1, 100, (numel,), generator=g).double() for _ in range(n)]


@pytest.mark.parametrize("n, numel", [(1, 3), (2, 12), (3, 11), (4, 3), (5, 17)])
def test_every_right_convention_leaves_the_sum_on_every_rank(n, numel):
    xs = inputs(n, numel)
    for a in range(n):
        out = simulate(xs, (a, a + 1, a - 1, a))
        assert all(torch.equal(o, sum(xs)) for o in out), a
        assert name_mistake(xs, out) is None


@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_known_mistake_is_named(n):
    xs = inputs(n, 12)
    assert name_mistake(xs, [sum(xs) / n] * n) == ("mean",)
    assert name_mistake(xs, simulate(xs, (1, 2, 0, 1), gather=False)) == ("scatter_only",)
    assert name_mistake(xs, simulate(xs, (1, 2, 0, 1), add=False)) == ("overwrite",)
    assert name_mistake(xs, simulate(xs, (0, 2, 0, 1)))[0] == "rs_pair"
    assert name_mistake(xs, simulate(xs, (1, 2, 1, 1)))[0] == "ag_pair"
    late = name_mistake(xs, simulate(xs, (1, 2, 1, 2)))  # all-gather one chunk late...
    assert late == ("overwrite",)  # ...sends untouched chunks: the numbers of an overwrite
    assert "or the all-gather starts one chunk late" in mistake_hint(late, n)
    if n == 4:
        mistake = name_mistake(xs, simulate(xs, (1, 2, 2, 3)))  # two chunks late
        assert mistake[0] == "ag_start"
        assert "all-gather step 0 sends chunk (r - 2) % N" in mistake_hint(mistake, n)


def test_a_message_that_does_not_fit_its_chunk_is_not_simulated():
    xs = inputs(3, 11)  # chunks of 4, 4 and 3 numbers
    assert simulate(xs, (0, 2, 0, 1)) is None
