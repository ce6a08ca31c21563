"""The ring's step-by-step data: its own logic, the one-process simulation, and a real run."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.core.collectives import chunk_bounds  # noqa: E402
from course_lib.lessons import ring_viz  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_states_end_complete_and_reduce_scatter_owns_chunk_r(world):
    states = ring_viz.ring_states(world)
    assert len(states) == 2 * (world - 1) + 1
    everyone = frozenset(range(world))
    middle = states[world - 1]  # after reduce-scatter
    for r in range(world):
        assert middle[r][r] == everyone  # rank r owns the full sum of chunk r
        others = [c for c in range(world) if c != r]
        assert all(middle[r][c] != everyone for c in others) or world == 1
    assert all(cell == everyone for row in states[-1] for cell in row)


def test_each_step_every_rank_sends_once_to_its_right():
    for world in (2, 3, 4, 6):
        steps = ring_viz.ring_schedule(world)
        assert [s.phase for s in steps] == (["reduce-scatter"] * (world - 1)
                                            + ["all-gather"] * (world - 1))
        for step in steps:
            assert sorted(step.sends) == list(range(world))  # every chunk moves once per step


def test_the_course_ring_is_one_of_the_rings_phase_steps_builds():
    for world in (1, 2, 3, 5):
        built = (ring_viz.phase_steps(world, ring_viz.REDUCE_SCATTER, send=1)
                 + ring_viz.phase_steps(world, ring_viz.ALL_GATHER, send=0))
        assert built == ring_viz.ring_schedule(world)


def test_a_step_can_go_left_keep_elsewhere_and_take_or_add():
    state = [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]]
    join = "{}+{}".format
    right = ring_viz.phase_steps(3, ring_viz.REDUCE_SCATTER, send=1)[0]  # r sends chunk r - 1
    assert ring_viz.apply_step(state, right, join) == [
        ["a0", "a1+c1", "a2"], ["b0", "b1", "b2+a2"], ["c0+b0", "c1", "c2"]]
    left = ring_viz.phase_steps(3, ring_viz.REDUCE_SCATTER, send=1, towards=-1, adds=False)[0]
    assert ring_viz.apply_step(state, left, join) == [
        ["b0", "a1", "a2"], ["b0", "c1", "b2"], ["c0", "c1", "a2"]]
    elsewhere = ring_viz.phase_steps(3, ring_viz.ALL_GATHER, send=0, keep=0)[0]  # into my own
    assert ring_viz.apply_step(state, elsewhere, join) == [
        ["c2", "a1", "a2"], ["b0", "a0", "b2"], ["c0", "c1", "b1"]]
    assert state[0] == ["a0", "a1", "a2"]  # the old state is left as it was


@pytest.mark.parametrize("world, shape", [(2, (10,)), (3, (7,)), (4, (3, 3)), (5, (2,))])
def test_simulation_sums_like_torch(world, shape):
    g = torch.Generator().manual_seed(world)
    tensors = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(world)]
    snapshots = ring_viz.simulate_ring_all_reduce(tensors)
    expected = torch.stack(tensors).sum(0).reshape(-1)
    for final in snapshots[-1]:
        torch.testing.assert_close(final, expected, rtol=1e-12, atol=1e-12)
    bounds = chunk_bounds(expected.numel(), world)
    for r, mine in enumerate(snapshots[world - 1]):  # after reduce-scatter: chunk r is done
        a, b = bounds[r]
        torch.testing.assert_close(mine[a:b], expected[a:b], rtol=1e-12, atol=1e-12)
    assert all(t.shape == shape for t in tensors)  # the inputs are untouched


def test_simulation_with_the_larger_chunks_last_sums_too():
    tensors = [torch.arange(7, dtype=torch.float64) * (r + 1) for r in range(3)]
    last = [(0, 2), (2, 4), (4, 7)]  # 2, 2 and 3 numbers
    snapshots = ring_viz.simulate_ring_all_reduce(tensors, last)
    assert all(torch.equal(final, sum(tensors)) for final in snapshots[-1])
    assert torch.equal(snapshots[2][0][0:2], sum(tensors)[0:2])  # rank 0 finished chunk 0


def test_simulation_and_sets_agree():
    """Rank r holding 2^r: the simulation's numbers are the bit masks of ring_states."""
    world = 4
    tensors = [torch.full((9,), float(1 << r), dtype=torch.float64) for r in range(world)]
    bounds = chunk_bounds(9, world)
    for snapshot, state in zip(ring_viz.simulate_ring_all_reduce(tensors),
                               ring_viz.ring_states(world), strict=True):
        masks = ring_viz.as_masks(state)
        for r in range(world):
            assert [int(snapshot[r][a]) for a, _ in bounds] == masks[r]


def test_bytes_per_rank_matches_two_n_minus_one_over_n():
    assert ring_viz.bytes_sent_per_rank(4000, 4) == [24000 * 4 // 4] * 4  # 1.5 x 16000 bytes
    assert ring_viz.bytes_sent_per_rank(4001, 4) == [24004, 24008, 24008, 24004]
    assert ring_viz.bytes_sent_per_rank(100, 1) == [0]
    # 3 elements on 4 ranks: chunks of 1, 1, 1, 0; rank r skips chunk r, then chunk r + 1
    assert ring_viz.bytes_sent_per_rank(3, 4, element_size=8) == [32, 32, 40, 40]


def test_describe_and_view():
    lines = ring_viz.describe_step(3, 1)
    assert lines[0].startswith("step 1 of 4 (reduce-scatter 1/2)")
    assert "rank 0 -> rank 1: chunk 2" in lines[1]
    assert ring_viz.describe_step(2, 2)[-1].endswith("sum |     sum")
    with pytest.raises(ValueError, match="step must be 0..6"):
        ring_viz.describe_step(4, 7)
    view = ring_viz.ring_view(4, 3)
    assert view["phase"] == "reduce-scatter"
    assert view["complete (rank, chunk)"] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    plt.close("all")
    fig = ring_viz.draw_before_after("reduce", [[0.0, 1.0], [10.0, 11.0]], [[10.0, 12.0], None])
    assert len(fig.axes) == 2
    plt.close("all")


@pytest.mark.slow
def test_real_ring_matches_the_predicted_steps(ring_trace_run):
    run = ring_trace_run  # 4 processes, launched once per session (conftest.py)
    trace = run.result["trace"]
    predicted = [ring_viz.as_masks(s) for s in ring_viz.ring_states(4)]
    sends = [s.sends for s in ring_viz.ring_schedule(4)]
    for r, mine in enumerate(trace["ranks"]):
        assert mine["states"] == [p[r] for p in predicted]
        assert mine["sent_chunks"] == [s[r] for s in sends]
        assert mine["states_match"] and mine["sends_match"]
    ring_rows = [row for row in run.result["bytes"] if row["algorithm"] == "ring"]
    for row in ring_rows:
        assert row["bytes_sent"] == ring_viz.bytes_sent_per_rank(row["numel"], 4)
    divisible = ring_rows[0]
    assert divisible["numel"] % 4 == 0
    assert all(b == divisible["tensor_bytes"] * 2 * 3 // 4 for b in divisible["bytes_sent"])
    assert all(all(v.values()) for v in run.result["equal_to_torch"].values())
