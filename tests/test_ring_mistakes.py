"""What exercise 6.3's hints know about wrong rings: right indices give the sum with either
chunk cut, each known mistake is named from what it produces, and a call of a collective or
of the library's ring is read from the file (no processes started)."""

import pytest
import torch

from course_lib.check.cases.ring_mistakes import REFUSED, cuts, mistake_hint, name_mistake, simulate
from course_lib.check.own_work import refused_use


def library_call(path: str) -> str | None:
    """What 6.3's checker reads in the file: the first refused call in ring_all_reduce."""
    found = refused_use(path, dict.fromkeys(REFUSED, ""), ("ring_all_reduce",))
    return f"{found[0]} (line {found[1]})" if found else None


def inputs(n: int, numel: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(n * 100 + numel)
    return [torch.randint(1, 100, (numel,), generator=g).double() for _ in range(n)]


@pytest.mark.parametrize("n, numel", [(1, 3), (2, 12), (3, 11), (4, 3), (5, 17)])
def test_every_right_convention_leaves_the_sum_on_every_rank_with_either_cut(n, numel):
    xs = inputs(n, numel)
    for bounds in cuts(numel, n):
        for a in range(n):
            out = simulate(xs, (a, a + 1, a - 1, a), bounds=bounds)
            assert all(torch.equal(o, sum(xs)) for o in out), (a, bounds)
            assert name_mistake(xs, out) is None


def test_the_two_cuts_put_the_larger_chunks_first_and_last():
    assert cuts(11, 4) == [[(0, 3), (3, 6), (6, 9), (9, 11)], [(0, 2), (2, 5), (5, 8), (8, 11)]]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_known_mistake_is_named(n):
    xs = inputs(n, 12)
    assert name_mistake(xs, [sum(xs) / n] * n) == ("mean",)
    assert name_mistake(xs, simulate(xs, gather=False)) == ("scatter_only",)
    assert name_mistake(xs, simulate(xs, rs_adds=False)) == ("overwrite",)
    assert name_mistake(xs, simulate(xs, ag_adds=True)) == ("gather_adds",)
    assert name_mistake(xs, simulate(xs, (0, 2, 0, 1)))[0] == "rs_pair"
    assert name_mistake(xs, simulate(xs, (1, 2, 1, 1)))[0] == "ag_pair"
    late = name_mistake(xs, simulate(xs, (1, 2, 1, 2)))  # all-gather one chunk late...
    assert late == ("overwrite",)  # ...sends untouched chunks: the numbers of an overwrite
    assert "or the all-gather starts one chunk late" in mistake_hint(late, n)
    if n == 4:
        mistake = name_mistake(xs, simulate(xs, (1, 2, 2, 3)))  # two chunks late
        assert mistake[0] == "ag_start"
        assert "all-gather step 0 sends chunk (r - 2) % N" in mistake_hint(mistake, n)


def test_a_mistake_is_named_with_the_larger_chunks_last_too():
    xs = inputs(3, 11)
    last = cuts(11, 3)[1]
    assert name_mistake(xs, simulate(xs, rs_adds=False, bounds=last)) == ("overwrite",)
    assert name_mistake(xs, simulate(xs, ag_adds=True, bounds=last)) == ("gather_adds",)


def test_the_hints_name_the_learners_indices_not_the_right_ones():
    hint = mistake_hint(("rs_pair", (0, 2, 0, 1)), 3)
    assert hint.startswith("in the reduce-scatter, rank r sends chunk (r - s) % N but adds what "
                           "arrives into chunk (r - s - 2) % N")
    assert "(r - s - 1)" not in hint


def test_numbers_the_chunks_leave_out_are_named():
    xs = inputs(3, 11)
    total = sum(xs)
    got = [torch.cat([total[:9], x[9:]]) for x in xs]  # chunks of 11 // 3 = 3 numbers each
    assert name_mistake(xs, got) == ("uncovered", [9, 10], 11)
    assert mistake_hint(name_mistake(xs, got), 3).startswith(
        "the last 2 of the 11 numbers (numel mod N = 11 mod 3) were never summed")
    got[1] = got[1].clone()
    got[1][9] += 1  # a number no rank kept as it was: not a chunk left out
    assert name_mistake(xs, got) is None


def test_a_chunk_added_to_the_one_it_sends_is_said_so():
    hint = mistake_hint(("rs_pair", (1, 1, 0, 1)), 2)
    assert hint.startswith("in the reduce-scatter, rank r adds its own chunk (r - s - 1) % N, "
                           "the one it sends, to the chunk its left neighbour sent, "
                           "(r - s - 2) % N")


def test_a_message_that_does_not_fit_its_chunk_is_not_simulated():
    xs = inputs(3, 11)  # chunks of 4, 4 and 3 numbers
    assert simulate(xs, (0, 2, 0, 1)) is None


CALLS = {
    "import torch.distributed as dist\n": ("dist.all_reduce(t, group=group)", "dist.all_reduce"),
    "import torch\n": ("torch.distributed.broadcast(t, 0)", "dist.broadcast"),
    "from torch.distributed import all_reduce\n": ("all_reduce(t)", "dist.all_reduce"),
    "from course_lib.core.collectives import ring_all_reduce as library_ring\n": (
        "library_ring(t, group)", "the library's ring_all_reduce"),
    "from course_lib.core import collectives\n": (
        "collectives.naive_all_reduce(t, group)", "the library's naive_all_reduce"),
}


@pytest.mark.parametrize("imports", CALLS)
def test_a_collective_or_the_library_called_in_the_function_is_read_from_the_file(
        tmp_path, imports):
    call, named = CALLS[imports]
    path = tmp_path / "my_ring.py"
    path.write_text(f"{imports}\n\ndef ring_all_reduce(t, group=None):\n    {call}\n")
    assert library_call(str(path)) == f"{named} (line 5)"


def test_the_same_calls_outside_the_function_are_its_own_business(tmp_path):
    path = tmp_path / "my_ring.py"
    path.write_text("import torch\nimport torch.distributed as dist\n\n\n"
                    "def ring_all_reduce(t, group=None):\n"
                    "    return torch.gather(t, 0, torch.zeros_like(t))  # a tensor method\n\n\n"
                    "if __name__ == '__main__':\n    dist.all_reduce(torch.ones(1))\n")
    assert library_call(str(path)) is None
