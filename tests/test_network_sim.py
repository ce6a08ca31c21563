"""The network simulator: each algorithm's bytes exactly, times that behave as the alpha-beta
model says, crossovers that agree with direct evaluation, nodes with two links, and clear
errors."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_lib.core.collectives import chunk_bounds  # noqa: E402
from course_lib.lessons import cost_model, ring_viz  # noqa: E402
from course_lib.lessons.links import LINKS, Cluster, Link, get_link, link_from_model  # noqa: E402
from course_lib.lessons.network_plots import (  # noqa: E402
    plot_algorithms,
    plot_bandwidth_optimal,
    plot_measured,
    plot_topology,
    plot_world_sizes,
)
from course_lib.lessons.network_sim import (  # noqa: E402
    ALGORITHMS,
    ANY_WORLD_SIZE,
    chunk_sizes,
    crossovers,
    fastest,
    predict_rows,
    simulate,
    time_of,
)

IB = "InfiniBand NDR 400 Gb/s"
NVLINK = "NVLink 4 (H100)"
H100_NODES = Cluster(8, NVLINK, IB)  # 8 GPUs per node, one InfiniBand adapter each
WORLD_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 64, 100, 255, 256, 1000, 1024, 4095, 4096]
NUMELS = [0, 1, 3, 7, 1000, 1001, 4096, 65537]  # float32 elements
KIB, GIB = 1 << 10, 1 << 30


def sizes_of(numel, world):
    return [(b - a) * 4 for a, b in chunk_bounds(numel, world)]


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_ring_bytes_are_every_chunk_but_two(world):
    """Rank r sends every chunk but r (reduce-scatter) and every chunk but r+1 (all-gather)."""
    for numel in NUMELS:
        run = simulate("ring", world, numel * 4, IB)
        sizes, total = sizes_of(numel, world), numel * 4
        law = [0] if world == 1 else [2 * total - sizes[r] - sizes[(r + 1) % world]
                                      for r in range(world)]
        assert list(run.bytes_sent) == law
        assert list(run.bytes_sent) == ring_viz.bytes_sent_per_rank(numel, world)
        if numel % world == 0:  # exactly 2(N-1)/N of the tensor on every rank
            assert all(b * world == 2 * (world - 1) * total for b in run.bytes_sent)
        assert run.messages_sent == (2 * (world - 1),) * world


@pytest.mark.parametrize("world", [2, 3, 4, 5, 7, 10])
def test_ring_bytes_match_a_walk_through_every_step(world):
    for numel in (1, 5, 10, 13, 64):
        walked = [0] * world
        for step in ring_viz.ring_schedule(world):
            for rank, chunk in enumerate(step.sends):
                walked[rank] += sizes_of(numel, world)[chunk]
        assert list(simulate("ring", world, numel * 4, IB).bytes_sent) == walked


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_naive_rank0_sends_n_minus_1_tensors_the_others_one(world):
    for numel in NUMELS:
        total = numel * 4
        run = simulate("naive", world, total, IB)
        assert list(run.bytes_sent) == [(world - 1) * total] + [total] * (world - 1)
        assert list(run.messages_sent) == [world - 1] + [1] * (world - 1)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_recursive_doubling_sends_log2_tensors_plus_fold_and_unfold(world):
    power = 2 ** int(math.log2(world))
    rounds = int(math.log2(power))
    for numel in NUMELS:
        total = numel * 4
        # ranks below N - power also send the sum back to an extra rank; extra ranks only fold
        expected = [rounds + (r < world - power) if r < power else 1 for r in range(world)]
        run = simulate("recursive_doubling", world, total, IB)
        assert list(run.messages_sent) == expected
        assert list(run.bytes_sent) == [m * total for m in expected]
        if world == power:
            assert run.bytes_sent == (rounds * total,) * world


@pytest.mark.parametrize("world", WORLD_SIZES)
@pytest.mark.parametrize("pieces", [1, 8])
def test_tree_sends_one_tensor_up_and_one_per_child(world, pieces):
    for numel in NUMELS:
        total = numel * 4
        children = [sum(c < world for c in (2 * r + 1, 2 * r + 2)) for r in range(world)]
        copies = [(r > 0) + children[r] for r in range(world)]
        run = simulate("tree", world, total, IB, tree_pieces=pieces)
        assert list(run.bytes_sent) == [c * total for c in copies]
        used = min(pieces, max(numel, 1))  # never more pieces than elements
        assert list(run.messages_sent) == [c * used for c in copies]


def test_chunk_sizes_are_chunk_bounds():
    for world in (1, 2, 3, 7, 64):
        for numel in (0, 1, 5, 64, 1001):
            assert [s * 4 for s in chunk_sizes(numel, world)] == sizes_of(numel, world)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_rank_costs_nothing(algorithm):
    run = simulate(algorithm, 1, 4 * 1000, Cluster(1, NVLINK, IB))
    assert (run.time_s, run.bytes_sent, run.messages_sent, run.steps) == (0.0, (0,), (0,), 0)


def test_steps_per_algorithm():
    assert simulate("naive", 8, 64, IB).steps == 14
    assert simulate("ring", 8, 64, IB).steps == 14
    assert simulate("recursive_doubling", 8, 64, IB).steps == 3
    assert simulate("recursive_doubling", 12, 64, IB).steps == 3 + 2  # fold and unfold
    assert simulate("tree", 7, 64, IB).steps == 4  # two levels up, two down
    assert simulate("tree", 7, 64, IB, tree_pieces=4).steps == 4 + 6
    assert simulate("halving_doubling", 1024, 4096, IB).steps == 2 * 10
    assert simulate("two_level", 64, 4096, H100_NODES).steps == 2 * 7 + 2 * 7
    assert simulate("ring_channels", 64, 4096, H100_NODES).steps == 2 * 63  # rings in step


@pytest.mark.parametrize("world", [2, 3, 4, 6, 8, 100])
def test_times_equal_the_cost_model_where_it_counts_the_same_messages(world):
    """naive and recursive doubling always; the ring when N divides the tensor."""
    model = cost_model.AlphaBeta(alpha_s=20e-6, beta_s_per_byte=1e-9)
    link = link_from_model(model)
    for numel in (world, 1000 * world, 2**18 * world):
        for name in cost_model.ALGORITHMS:
            expected = cost_model.predict_all_reduce_s(model, name, numel * 4, world)
            assert simulate(name, world, numel * 4, link).time_s == pytest.approx(expected)


def test_tree_times_by_hand():
    """m = one message. N=3: 2 in to rank 0, 2 out. N=7: leaves -> level 1 (2m), level 1 ->
    rank 0 one after the other (4m), rank 0 -> level 1 (6m), level 1 -> leaves (8m)."""
    m = get_link(IB).message_s(4096)
    assert simulate("tree", 2, 4096, IB).time_s == pytest.approx(2 * m)
    assert simulate("tree", 3, 4096, IB).time_s == pytest.approx(4 * m)
    assert simulate("tree", 7, 4096, IB).time_s == pytest.approx(8 * m)


def test_each_ring_step_lasts_as_long_as_its_largest_chunk():
    """5 elements on 4 ranks: chunks of 2, 1, 1, 1 elements; every step sends all four."""
    slow = Link("slow", 1e3, 0.0)  # 1 kB/s and no latency: the time is the bytes
    assert simulate("ring", 4, 5 * 4, slow).time_s == pytest.approx(6 * 8 / 1e3)
    added = simulate("ring", 4, 5 * 4, slow, reduce_bytes_per_s=2e3).time_s
    assert added == pytest.approx(6 * 8 / 1e3 + 3 * 8 / 2e3)  # adds in reduce-scatter only


def test_pipelining_the_tree_pays_for_big_tensors():
    whole = simulate("tree", 1024, 64 * 2**20, IB).time_s
    piped = simulate("tree", 1024, 64 * 2**20, IB, tree_pieces=16).time_s
    assert piped < whole / 2


def test_additions_cost_time_on_the_receiver():
    link, size, rate = get_link(IB), 4 * 2**20, 10e9
    run = simulate("naive", 5, size, link, reduce_bytes_per_s=rate)
    assert run.time_s == pytest.approx(4 * (link.message_s(size) + size / rate)
                                       + 4 * link.message_s(size))
    assert run.time_s > simulate("naive", 5, size, link).time_s


@pytest.mark.parametrize("algorithm", ANY_WORLD_SIZE)
@pytest.mark.parametrize("world", [2, 7, 64, 1000])
def test_time_grows_with_size(algorithm, world):
    sizes = [4 * 4**k for k in range(14)]  # 4 B .. 256 MiB
    times = [simulate(algorithm, world, s, IB).time_s for s in sizes]
    assert all(a <= b for a, b in zip(times, times[1:], strict=False))
    assert times[-1] > 2 * times[0]  # and the bytes do show


@pytest.mark.parametrize("world", [8, 64, 256])
def test_ring_time_approaches_its_bandwidth_bound(world):
    link = get_link(IB)
    bound = 2 * (world - 1) / world * GIB / link.bandwidth_bytes_per_s
    time_s = simulate("ring", world, GIB, link).time_s
    assert bound < time_s < 1.01 * bound


def test_ring_time_for_tiny_tensors_is_2_n_minus_1_latencies():
    link = get_link(IB)
    times = [simulate("ring", n, 4, link).time_s for n in (8, 64, 512, 4096)]
    assert times == sorted(times) and len(set(times)) == 4
    for n, t in zip((8, 64, 512, 4096), times, strict=True):
        assert t == pytest.approx(2 * (n - 1) * link.latency_s, rel=1e-3)


@pytest.mark.parametrize("world", [64, 1024, 4096])
def test_recursive_doubling_wins_small_and_ring_wins_large_on_infiniband(world):
    assert fastest(IB, world, KIB) == "recursive_doubling"
    assert fastest(IB, world, GIB) == "ring"


@pytest.mark.parametrize("world, pieces", [(64, 1), (1024, 1), (1024, 8), (100, 8)])
def test_crossovers_agree_with_direct_evaluation(world, pieces):
    ranges = crossovers(IB, world, tree_pieces=pieces)
    assert ranges[0].low_bytes == KIB and ranges[-1].high_bytes == GIB
    assert len(ranges) >= 2
    for before, after in zip(ranges, ranges[1:], strict=False):
        assert after.low_bytes == before.high_bytes + 4  # no gap: one float32 apart
        assert before.algorithm != after.algorithm
        assert fastest(IB, world, before.high_bytes, tree_pieces=pieces) == before.algorithm
        assert fastest(IB, world, after.low_bytes, tree_pieces=pieces) == after.algorithm
    for r in ranges:  # and inside each range, its algorithm wins
        middle = 4 * round(math.sqrt(r.low_bytes * r.high_bytes) / 4)
        assert fastest(IB, world, middle, tree_pieces=pieces) == r.algorithm


def test_a_pipelined_tree_wins_between_recursive_doubling_and_the_ring():
    names = [r.algorithm for r in crossovers(IB, 1024, tree_pieces=8)]
    assert names == ["recursive_doubling", "tree", "ring"]


def test_4096_ranks_complete():
    for name in ALGORITHMS:
        run = simulate(name, 4096, 4 * (2**24 + 5), H100_NODES)  # 64 MiB and a bit: uneven
        assert len(run.bytes_sent) == len(run.messages_sent) == 4096
        assert run.time_s > 0


@pytest.mark.parametrize("call, match", [
    (lambda: simulate("ring", 0, 64, IB), "world_size"),
    (lambda: simulate("ring", -3, 64, IB), "world_size"),
    (lambda: simulate("ring", 2.0, 64, IB), "world_size"),
    (lambda: simulate("ring", True, 64, IB), "world_size"),
    (lambda: simulate("ring", 4, -4, IB), "nbytes"),
    (lambda: simulate("ring", 4, 6, IB), "multiple of element_size"),
    (lambda: simulate("ring", 4, 64, IB, element_size=0), "element_size"),
    (lambda: simulate("butterfly", 4, 64, IB), "pass one of"),
    (lambda: simulate("ring", 4, 64, "Ethernet 10G"), "pass a Link or one of"),
    (lambda: simulate("tree", 4, 64, IB, tree_pieces=0), "tree_pieces"),
    (lambda: simulate("naive", 4, 64, IB, reduce_bytes_per_s=0), "reduce_bytes_per_s"),
    (lambda: crossovers(IB, 8, low_bytes=GIB, high_bytes=KIB), "low_bytes <= high_bytes"),
    (lambda: link_from_model(cost_model.AlphaBeta(1e-6, 0.0)), "beta_s_per_byte > 0"),
    (lambda: simulate("halving_doubling", 12, 64, IB), "power of two, got 12"),
    (lambda: simulate("two_level", 16, 64, IB), "pass a links.Cluster"),
    (lambda: simulate("ring_channels", 16, 64, IB), "ring_channels needs nodes"),
    (lambda: simulate("ring", 12, 64, H100_NODES), "multiple of ranks_per_node"),
    (lambda: Cluster(0, NVLINK, IB), "ranks_per_node"),
    (lambda: Cluster(8, NVLINK, "Ethernet 10G"), "pass a Link or one of"),
])
def test_bad_input_says_what_to_pass(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_time_of_is_the_simulated_time_remembered():
    for _ in range(2):  # played, then remembered
        assert time_of("tree", 100, 4096, IB, tree_pieces=8) == simulate(
            "tree", 100, 4096, IB, tree_pieces=8).time_s
    assert time_of("two_level", 16, 4096, H100_NODES) == simulate(
        "two_level", 16, 4096, H100_NODES).time_s
    time_of("ring", 2, 64, IB)
    for bad in (2.0, True):  # equal to 2 and 1 as keys, but not world sizes
        with pytest.raises(ValueError, match="world_size"):
            time_of("ring", bad, 64, IB)


def test_link_table():
    assert get_link("InfiniBand NDR 400 Gb/s").bandwidth_bytes_per_s == 50e9
    assert get_link("InfiniBand HDR 200 Gb/s").bandwidth_bytes_per_s == 25e9
    assert get_link("NVLink 4 (H100)").bandwidth_bytes_per_s == 450e9
    assert get_link("PCIe 4.0 x16").bandwidth_bytes_per_s == pytest.approx(31.5e9, rel=1e-3)
    assert get_link("PCIe 5.0 x16").bandwidth_bytes_per_s == pytest.approx(63.0e9, rel=1e-3)
    assert all(link.latency_s > 0 and link.name == name for name, link in LINKS.items())
    mine = Link("mine", 1e9, 1e-5)
    assert get_link(mine) is mine and simulate("ring", 2, 8, mine).link == "mine"


def test_predictions_come_as_measured_rows():
    model = cost_model.AlphaBeta(alpha_s=50e-6, beta_s_per_byte=1 / 2e9)
    sizes = [4096, 65536, 1048576, 4194303]  # the last is rounded down as the benchmark does
    rows = predict_rows(model, sizes)
    assert sorted(rows) == [2, 4]
    for world, mine in rows.items():
        assert len(mine) == 3 * len(sizes)
        for row in mine:
            assert set(row) == {"algorithm", "bytes", "median_s"}
            assert row["bytes"] % 4 == 0 and row["bytes"] in {4096, 65536, 1048576, 4194300}
            expected = cost_model.predict_all_reduce_s(model, row["algorithm"], row["bytes"],
                                                       world)
            assert row["median_s"] == pytest.approx(expected)
    fig = cost_model.plot_benchmark(rows, model, algorithms=("naive", "ring"))
    plt.close(fig)


def test_plots_return_figures_with_a_line_per_algorithm():
    fig = plot_algorithms(IB, 256, points=13)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert len(ax.get_lines()) == len(ANY_WORLD_SIZE) + len(crossovers(IB, 256, points=13)) - 1
    plt.close(fig)
    fig = plot_world_sizes(IB, 2**20, world_sizes=(2, 8, 64))
    assert len(fig.axes[0].get_lines()) == len(ANY_WORLD_SIZE)
    plt.close(fig)


def test_the_bandwidth_optimal_plot_comes_down_to_the_bound():
    fig = plot_bandwidth_optimal(IB, 64, points=7)
    *curves, bound = fig.axes[0].get_lines()
    assert [c.get_label() for c in curves] == ["ring", "halving_doubling", "recursive_doubling"]
    assert list(bound.get_ydata()) == [1, 1]
    ring, halving, doubling = (c.get_ydata() for c in curves)
    assert 1 < halving[-1] < ring[-1] < 1.01  # 1 GiB: both reach the bytes' own time
    assert doubling[-1] == pytest.approx(6 / (2 * 63 / 64), rel=1e-3)  # log2(64) tensors
    plt.close(fig)


def test_the_topology_plot_sweeps_the_link_between_nodes():
    fig = plot_topology(NVLINK, IB, 64, 2**30, points=5)
    left, right = fig.axes
    ring, channels, two_level = (line.get_ydata() for line in left.get_lines()[:3])
    assert all(a > b for a, b in zip(ring, two_level, strict=True))  # ahead of one channel
    assert all(a > b for a, b in zip(two_level, channels, strict=True))  # 1 GiB: L rings ahead
    assert ring[0] / two_level[0] > ring[-1] / two_level[-1]  # the more, the slower between
    heights = [bar.get_height() for bar in right.patches]  # in all, between; per algorithm
    assert heights == pytest.approx([2 * 63 / 64, 2 * 63 / 64, 2 * 63 / 64, 2 * 63 / 64 / 8,
                                     2 * 63 / 64, 2 * 7 / 64])
    assert [t.get_text() for t in right.get_xticklabels()] == [
        "ring, 1 channel", "ring, 8 channels", "two_level"]
    plt.close(fig)


def measured_rows(algorithms, sizes):
    """Rows as bench_all_reduce_worker saves them, with a spread."""
    return [{"algorithm": name, "bytes": b, "median_s": 2e-3, "q1_s": 1e-3, "q3_s": 4e-3,
             "min_s": 5e-4} for name in algorithms for b in sizes]


def test_the_measured_plot_shows_the_spread_and_the_simulation():
    sizes = [4096, 65536]
    runs = {n: measured_rows(("naive", "ring", "torch"), sizes) for n in (2, 4)}
    model = cost_model.AlphaBeta(alpha_s=50e-6, beta_s_per_byte=1 / 2e9)
    fig = plot_measured(runs, predict_rows(model, sizes), algorithms=("naive", "ring", "torch"))
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert len(ax.containers) == 3  # median with quartile bars, per algorithm
        bars = ax.containers[0].lines[2][0].get_segments()  # naive's vertical bars
        assert [(seg[0][1], seg[1][1]) for seg in bars] == [(1e-3, 4e-3)] * len(sizes)
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(dashed) == 2  # naive and ring simulated; torch is not
    plt.close(fig)
    fig = plot_measured(runs)  # measurements only
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
    plt.close(fig)


def common_low_bits(a: int, b: int, bits: int) -> int:
    """How many of the lowest ``bits`` bits a and b share before they first differ."""
    return next((k for k in range(bits) if (a ^ b) >> k & 1), bits)


def bytes_law(algorithm, n, numel, per_node=1):
    """Each algorithm's rule for the bytes each rank sends (notebook 06b, section 3)."""
    size = numel * 4
    if n == 1:
        return [0]
    if algorithm == "naive":
        return [(n - 1) * size] + [size] * (n - 1)
    if algorithm == "ring":
        return ring_viz.bytes_sent_per_rank(numel, n)
    if algorithm == "recursive_doubling":
        power = 1 << (n.bit_length() - 1)
        rounds, extra = power.bit_length() - 1, n - power
        return [size * (rounds + (r < extra)) if r < power else size for r in range(n)]
    if algorithm == "halving_doubling":  # every chunk but r in, then chunk c log2-shared times
        chunks, bits = sizes_of(numel, n), n.bit_length() - 1
        return [size - chunks[r] + sum(c * common_low_bits(i, r, bits)
                                       for i, c in enumerate(chunks)) for r in range(n)]
    if algorithm == "two_level":  # a ring in the node, then a ring of its chunk across nodes
        return [a + b for a, b in zip(two_level_inside(n, numel, per_node),
                                      two_level_between(n, numel, per_node), strict=True)]
    return [size * ((r > 0) + sum(c < n for c in (2 * r + 1, 2 * r + 2))) for r in range(n)]


def two_level_inside(n, numel, per_node):
    in_node = ring_viz.bytes_sent_per_rank(numel, per_node)  # by place in the node
    return [in_node[r % per_node] for r in range(n)]


def two_level_between(n, numel, per_node):
    """Rank g L + i all-reduces chunk i of the node's ring among the nodes' ranks i."""
    across = [ring_viz.bytes_sent_per_rank(c // 4, n // per_node)  # [place][node]
              for c in sizes_of(numel, per_node)]
    return [across[r % per_node][r // per_node] for r in range(n)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 12, 100, 1000, 4096])
def test_notebook_06b_bytes_law_holds_for_every_algorithm(world):
    for numel in (1, 1000, 1001, 2**20 + 3):
        for name in ANY_WORLD_SIZE:
            for pieces in (1, 8):
                run = simulate(name, world, 4 * numel, IB, tree_pieces=pieces)
                assert list(run.bytes_sent) == bytes_law(name, world, numel)
                assert run.bytes_between_nodes == (0,) * world  # one kind of link


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 64, 128])
def test_halving_doubling_bytes_law(world):
    """Reduce-scatter: every chunk but its own; all-gather: chunk c as many times as c and r
    share low bits (chunk r log2 N times). Even chunks: 2(N-1)/N of the tensor, as the ring."""
    for numel in NUMELS + [world * 1000]:
        run = simulate("halving_doubling", world, 4 * numel, IB)
        assert list(run.bytes_sent) == bytes_law("halving_doubling", world, numel)
        assert run.messages_sent == (2 * (world.bit_length() - 1),) * world
        if numel % world == 0:
            assert all(b * world == 2 * (world - 1) * 4 * numel for b in run.bytes_sent)
            assert run.bytes_sent == simulate("ring", world, 4 * numel, IB).bytes_sent


@pytest.mark.parametrize("per_node, nodes", [(1, 5), (2, 3), (4, 1), (4, 4), (8, 8), (3, 7),
                                             (8, 512)])
def test_two_level_bytes_law(per_node, nodes):
    world = per_node * nodes
    for numel in NUMELS:
        run = simulate("two_level", world, 4 * numel, Cluster(per_node, NVLINK, IB))
        assert list(run.bytes_sent) == bytes_law("two_level", world, numel, per_node)
        assert list(run.bytes_between_nodes) == two_level_between(world, numel, per_node)
        if numel % world == 0:  # the ring's 2(N-1)/N in all, 2(G-1)/N between nodes
            assert all(b * world == 2 * (world - 1) * 4 * numel for b in run.bytes_sent)
            assert all(b * world == 2 * (nodes - 1) * 4 * numel
                       for b in run.bytes_between_nodes)


@pytest.mark.parametrize("world", [2, 8, 64, 1024])
def test_halving_doubling_is_the_rings_bytes_in_2_log2_n_latencies(world):
    model = cost_model.AlphaBeta(alpha_s=20e-6, beta_s_per_byte=1e-9)
    link = link_from_model(model)
    for numel in (world, 1000 * world):
        latencies, in_a_row = cost_model.latencies_and_bytes("halving_doubling", 4 * numel,
                                                             world)
        assert latencies == 2 * (world.bit_length() - 1)
        assert in_a_row == cost_model.latencies_and_bytes("ring", 4 * numel, world)[1]
        halving = simulate("halving_doubling", world, 4 * numel, link).time_s
        assert halving == pytest.approx(latencies * 20e-6 + in_a_row * 1e-9)
        assert halving <= simulate("ring", world, 4 * numel, link).time_s


def brute_force_ring_s(world, numel, cluster):
    """Every step: the slowest of the N messages, each on the link it takes."""
    sizes = sizes_of(numel, world)
    return sum(max(cluster.link(r, (r + 1) % world).message_s(sizes[(r - step - shift) % world])
                   for r in range(world))
               for shift in (1, 0) for step in range(world - 1))


@pytest.mark.parametrize("per_node, nodes", [(1, 3), (2, 1), (2, 3), (3, 2), (4, 5)])
def test_a_flat_ring_on_nodes_waits_for_its_slowest_message(per_node, nodes):
    fast, slow = Link("fast", 1e3, 0.5), Link("slow", 1e2, 0.1)
    for inside, between in ((fast, slow), (slow, fast), (fast, fast)):
        cluster = Cluster(per_node, inside, between)
        for numel in (0, 1, 2, 5, 7, 13, 61):
            run = simulate("ring", per_node * nodes, 4 * numel, cluster)
            assert run.time_s == pytest.approx(brute_force_ring_s(per_node * nodes, numel,
                                                                  cluster))
            leaving = [r for r in range(run.world_size) if nodes > 1 and r % per_node ==
                       per_node - 1]
            assert [r for r, b in enumerate(run.bytes_between_nodes) if b] == (
                leaving if numel else [])


def test_two_level_time_by_hand():
    """Even chunks, no adds: 2(L-1) messages of n/L inside, then 2(G-1) of n/N between."""
    inside, between, n = get_link(NVLINK), get_link(IB), 2**30
    run = simulate("two_level", 64, n, H100_NODES)
    assert run.time_s == pytest.approx(2 * 7 * inside.message_s(n / 8)
                                       + 2 * 7 * between.message_s(n / 64))
    flat = simulate("ring", 64, n, H100_NODES)
    assert flat.time_s == pytest.approx(2 * 63 * between.message_s(n / 64))


def walk_ring_channels(per_node, nodes, numel):
    """Every message of the L rings, one by one: (bytes each rank sends, the part that leaves
    its node, and per step, each rank's largest message between nodes and its bytes inside)."""
    world = per_node * nodes
    sent, between = [0] * world, [0] * world
    steps = [([0] * world, [0] * world) for _ in range(2 * (world - 1))]
    for c, (start, end) in enumerate(chunk_bounds(numel, per_node)):  # ring c's part
        order = [g * per_node + (c + 1 + j) % per_node for g in range(nodes)
                 for j in range(per_node)]  # ring c leaves each node from place c
        chunks = sizes_of(end - start, world)
        for s, (shift, step) in enumerate((shift, step) for shift in (1, 0)
                                          for step in range(world - 1)):
            for p, rank in enumerate(order):
                nbytes, to = chunks[(p - step - shift) % world], order[(p + 1) % world]
                sent[rank] += nbytes
                if rank // per_node != to // per_node:
                    between[rank] += nbytes
                    steps[s][0][rank] = max(steps[s][0][rank], nbytes)
                else:
                    steps[s][1][rank] += nbytes
    return sent, between, steps


@pytest.mark.parametrize("per_node, nodes", [(1, 5), (2, 3), (4, 1), (4, 4), (8, 8), (3, 7)])
def test_ring_channels_bytes_walked_message_by_message(per_node, nodes):
    """Each ring sends 2(N-1)/N of its part; every rank leaves its node in exactly one ring."""
    world = per_node * nodes
    for numel in NUMELS + [world * per_node * 1000]:
        run = simulate("ring_channels", world, 4 * numel, Cluster(per_node, NVLINK, IB))
        sent, between, _ = walk_ring_channels(per_node, nodes, numel)
        assert (list(run.bytes_sent), list(run.bytes_between_nodes)) == (sent, between)
        if numel % (world * per_node) == 0:  # even: the ring's bytes, 1/L of them between
            assert run.bytes_sent == simulate("ring", world, 4 * numel, IB).bytes_sent
            assert all(b * world * per_node == 2 * (world - 1) * 4 * numel * (nodes > 1)
                       for b in run.bytes_between_nodes)


@pytest.mark.parametrize("per_node, nodes", [(2, 3), (4, 1), (4, 4), (3, 7), (1, 6)])
def test_ring_channels_step_lasts_as_long_as_its_slowest_side(per_node, nodes):
    """Even parts: each step, the adapter's one chunk or the L-1 chunks for the neighbour
    inside, whichever takes longer. Uneven: never faster than the messages walked one by one."""
    fast, slow = Link("fast", 1e3, 0.5), Link("slow", 1e2, 0.1)
    world = per_node * nodes
    for inside, between in ((fast, slow), (slow, fast)):
        cluster = Cluster(per_node, inside, between)
        for numel in (world * per_node, 7, 61):
            _, _, steps = walk_ring_channels(per_node, nodes, numel)
            walked = sum(max([between.message_s(b) for b in out if b]
                             + [inside.message_s(b) for b in stay if b] + [0.0])
                         for out, stay in steps)
            time_s = simulate("ring_channels", world, 4 * numel, cluster).time_s
            if numel % (world * per_node) == 0:
                assert time_s == pytest.approx(walked)
            assert time_s >= walked * (1 - 1e-12)


def test_ring_channels_on_one_adapter_a_node_is_the_ring():
    nodes = Cluster(1, NVLINK, IB)
    for numel in (1, 1000, 1001):
        flat, channels = (simulate(a, 8, 4 * numel, nodes) for a in ("ring", "ring_channels"))
        assert channels.bytes_sent == flat.bytes_sent
        assert channels.time_s == pytest.approx(flat.time_s, rel=1e-12)


def test_ring_channels_and_two_level_by_hand():
    """64 ranks, 1 GiB: a step of the L rings moves n/(L N) over the adapter and 7 such chunks
    over NVLink at once; the two-level all-reduce runs its phases one after the other."""
    inside, between, n = get_link(NVLINK), get_link(IB), 2**30
    chunk = n / (8 * 64)
    run = simulate("ring_channels", 64, n, H100_NODES)
    assert run.time_s == pytest.approx(2 * 63 * max(between.message_s(chunk),
                                                    inside.message_s(7 * chunk)))
    assert max(run.bytes_between_nodes) * 64 * 8 == 2 * 63 * n  # 2(N-1)/N of a part of n/L
    added = simulate("ring_channels", 64, n, H100_NODES, reduce_bytes_per_s=1e12).time_s
    assert added == pytest.approx(run.time_s + 63 * 8 * chunk / 1e12)  # one chunk of each ring


def test_bytes_between_nodes_are_counted_message_by_message():
    run = simulate("naive", 16, 4000, H100_NODES)  # ranks 8-15 send to rank 0 across
    assert run.bytes_between_nodes == (8 * 4000,) + (0,) * 7 + (4000,) * 8
    hd = simulate("halving_doubling", 64, 4 * 64, H100_NODES)  # distances 8, 16, 32 leave
    assert hd.bytes_between_nodes == (2 * 4 * (4 + 2 + 1),) * 64


def test_notebook_06b_claims_about_the_simulated_network():
    small, big = 4096, 64 * 2**20
    at = {n: {a: simulate(a, n, big, IB, tree_pieces=8) for a in ANY_WORLD_SIZE}
          for n in (8, 4096)}
    assert at[4096]["ring"].time_s < 4 * at[8]["ring"].time_s
    assert at[4096]["naive"].time_s > 500 * at[8]["naive"].time_s
    assert at[4096]["recursive_doubling"].time_s == pytest.approx(
        4 * at[8]["recursive_doubling"].time_s, rel=1e-9)
    assert min(at[4096], key=lambda a: at[4096][a].time_s) == "ring"
    assert at[4096]["ring"].max_bytes_sent < 2 * big <= at[4096]["tree"].max_bytes_sent <= 3 * big
    assert all(fastest(IB, 2**k, small, tree_pieces=8) == "recursive_doubling"
               for k in range(3, 13))
    ring_from = {}
    for n in (8, 64, 512, 4096):
        ranges = crossovers(IB, n, tree_pieces=8, points=16)
        assert [r.algorithm for r in ranges] == (["recursive_doubling", "ring"] if n < 512 else
                                                 ["recursive_doubling", "tree", "ring"])
        ring_from[n] = ranges[-1].low_bytes
    assert ring_from[8] < ring_from[64] < ring_from[512] < ring_from[4096]
    nvlink = crossovers(NVLINK, 8, tree_pieces=8, points=16)[-1].low_bytes
    assert nvlink > ring_from[8]


def test_notebook_06b_claims_about_bandwidth_and_topology():
    """4,096 ranks, 64 MiB: N divides the tensor, so every rank sends 2(N-1)/N of it."""
    halving = {n: simulate("halving_doubling", n, 64 * 2**20, IB) for n in (1024, 4096)}
    ring = {n: simulate("ring", n, 64 * 2**20, IB) for n in (1024, 4096)}
    for n in (1024, 4096):
        assert halving[n].bytes_sent == ring[n].bytes_sent == (2 * (n - 1) * 2**26 // n,) * n
        assert ring[n].time_s > 1.4 * halving[n].time_s
    assert ring[4096].time_s > 2.5 * halving[4096].time_s

    def over_bound(name, nbytes):  # 1,024 ranks: the time over that of the bytes alone
        return simulate(name, 1024, nbytes, IB).time_s / (
            2 * 1023 / 1024 * nbytes / get_link(IB).bandwidth_bytes_per_s)

    assert over_bound("halving_doubling", 2 << 20) > 1.1 > over_bound("halving_doubling", 4 << 20)
    assert over_bound("ring", 256 << 20) > 1.1 > over_bound("ring", 512 << 20)
    gain = {}
    for between in ("InfiniBand HDR 200 Gb/s", IB, NVLINK):
        flat, two = (simulate(a, 64, 2**30, Cluster(8, NVLINK, between)).time_s
                     for a in ("ring", "two_level"))
        gain[between] = flat / two
    assert gain["InfiniBand HDR 200 Gb/s"] > gain[IB] > 4 and 1 < gain[NVLINK] < 1.03
    assert gain[IB] == pytest.approx(4.8, abs=0.05) and gain["InfiniBand HDR 200 Gb/s"] > 6


def test_notebook_06b_claims_two_level_against_a_ring_per_adapter():
    """The fair baseline: the flat ring in 8 channels, one per adapter. At 1 GiB on 64 ranks it
    beats the two-level all-reduce on every link between nodes; the two-level one wins below a
    size that grows with N (its 2(L-1) + 2(G-1) steps against 2(N-1)), at 4,096 ranks up to
    1 GiB; and it sends fewer bytes between nodes, 2(G-1)/N of the tensor against 2(N-1)/(N L)."""
    for between in ("InfiniBand HDR 200 Gb/s", IB, NVLINK):
        nodes = Cluster(8, NVLINK, between)
        flat, channels, two = (simulate(a, 64, 2**30, nodes)
                               for a in ("ring", "ring_channels", "two_level"))
        assert channels.time_s < two.time_s < flat.time_s
        assert channels.bytes_sent == two.bytes_sent == flat.bytes_sent
        assert max(two.bytes_between_nodes) < max(channels.bytes_between_nodes)
        assert max(channels.bytes_between_nodes) * 8 == max(flat.bytes_between_nodes)
    assert flat.time_s / channels.time_s > 1.1  # NVLink between too: 8 links, not 1
    two_level_up_to = {}
    for n in (64, 512, 4096):
        ranges = crossovers(H100_NODES, n, algorithms=("two_level", "ring_channels"), points=16)
        assert ranges[0].algorithm == "two_level"
        two_level_up_to[n] = ranges[0].high_bytes
        assert [r.algorithm for r in ranges] == (["two_level", "ring_channels"] if n < 4096
                                                 else ["two_level"])
    assert 16 << 20 < two_level_up_to[64] < 32 << 20  # about 23 MB
    assert two_level_up_to[64] < two_level_up_to[512] < two_level_up_to[4096] == GIB
