"""Every claim that notebooks 05, 06, 06b and 07 assert, asserted again with the same runs
(06b's simulated network: tests/test_network_sim.py).

One launch per (module, world size), shared by the tests that read it (module-scoped fixtures).
"""

import pytest
import torch
from demo_runs import PINGPONG_SIZES  # the sizes of the shared ring-trace launch

from course_lib.core.accumulation import count_target_tokens
from course_lib.core.collectives import chunk_bounds
from course_lib.demos.collectives_tour import COLLECTIVES, expected_after
from course_lib.lessons import cost_model, ring_viz
from course_lib.runtime.launch import launch
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import TransformerConfig, make_transformer
from course_lib.tasks.sequences import global_batch

pytestmark = pytest.mark.slow
BENCH_SIZES = [4096, 4194304]
BENCH_ALGORITHMS = ["naive", "ring", "recursive_doubling", "torch"]
FAST_RING_STEPS = ["fast_reuse", "fast_sliced", "fast_one_stream"]  # 06b, section 6
STEPS = 8


@pytest.fixture
def tour(tour_run):  # launched once per session (conftest.py), read by several test files
    return tour_run.result


@pytest.fixture
def traced(ring_trace_run):
    return ring_trace_run.result


# ---- notebook 05 ---------------------------------------------------------------------------

def test_05_four_ranks_meet(tour):
    assert [r["rank"] for r in tour["ranks"]] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["master_port_set"] for r in tour["ranks"])


def test_05_point_to_point(tour):
    p2p = tour["point_to_point"]
    assert p2p["received_by_1"] == p2p["sent"]
    assert p2p["from_left"] == [float((r - 1) % 4) for r in range(4)]


def test_05_each_collective_checked_on_every_rank(tour):
    for name in COLLECTIVES:
        entry = tour["collectives"][name]
        assert entry["ok"] == [True] * 4, name
        assert entry["after"] == expected_after(name, entry["before"]), name
    sums = [sum(10 * r + c for r in range(4)) for c in range(4)]
    assert tour["collectives"]["all_reduce"]["after"] == [sums] * 4
    assert tour["collectives"]["reduce_scatter"]["after"] == [[s] for s in sums]


def test_05_and_06b_ping_pong_fits_alpha_beta(traced):
    rows = traced["pingpong"]
    assert [r["bytes"] for r in rows] == PINGPONG_SIZES
    nbytes, fastest = [r["bytes"] for r in rows], [r["min_s"] for r in rows]
    model = cost_model.fit_alpha_beta(nbytes, fastest)
    errors = cost_model.relative_errors(model, nbytes, fastest)
    assert all(r["echo_exact"] for r in rows)
    assert fastest[-1] > fastest[0] and model.beta_s_per_byte > 0
    assert all(1 / 4 < 1 + e < 4 for e in errors[-2:])


# ---- notebook 06 ---------------------------------------------------------------------------

def test_06_pictures():
    assert [b - a for a, b in chunk_bounds(10, 4)] == [3, 3, 2, 2]
    assert all(cell == frozenset(range(4)) for row in ring_viz.ring_states(4)[-1] for cell in row)
    assert ring_viz.ring_view()["complete (rank, chunk)"] == [(r, r) for r in range(4)]
    assert cost_model.ring_bytes_fraction(1024) < 2


def test_06_real_ring_as_pictured(traced):
    predicted = [ring_viz.as_masks(state) for state in ring_viz.ring_states(4)]
    for rank, mine in enumerate(traced["trace"]["ranks"]):
        assert mine["states"] == [p[rank] for p in predicted]
        assert mine["sent_chunks"] == [s.sends[rank] for s in ring_viz.ring_schedule(4)]


def test_06_equal_to_torch_on_every_rank(traced):
    assert all(all(row.values()) for row in traced["equal_to_torch"].values())
    assert len(traced["equal_to_torch"]) == 5


def test_06_bytes_per_rank(traced):
    world = traced["world_size"]
    seen = set()
    for row in traced["bytes"]:
        n_bytes = row["tensor_bytes"]
        seen.add(row["algorithm"])
        if row["algorithm"] == "ring":
            assert row["bytes_sent"] == ring_viz.bytes_sent_per_rank(row["numel"], world)
            if row["numel"] % world == 0:
                assert all(b * world == 2 * (world - 1) * n_bytes for b in row["bytes_sent"])
        elif row["algorithm"] == "naive":
            assert row["bytes_sent"] == [(world - 1) * n_bytes] + [n_bytes] * (world - 1)
        else:
            assert row["bytes_sent"] == [2 * n_bytes] * world
    assert seen == {"naive", "ring", "recursive_doubling"}


# ---- notebook 06b --------------------------------------------------------------------------

def test_06b_cost_model_counts():
    ring, halving = (cost_model.latencies_and_bytes(a, 1.0, 1024)
                     for a in ("ring", "halving_doubling"))
    assert ring[1] == halving[1] < 2 and (ring[0], halving[0]) == (2046, 20)  # same bytes


@pytest.mark.parametrize("world", [2, 4])
def test_06b_benchmark_equal_and_grows(world):
    """Section 2's benchmark, and section 6's fast ring in the same launch: every result equal
    to dist.all_reduce's, the four algorithms' fastest calls slower at 4 MiB than at 4 KiB."""
    algorithms = BENCH_ALGORITHMS + FAST_RING_STEPS
    result = launch("course_lib.demos.bench_all_reduce_worker", nproc=world, timeout_s=300,
                    quiet=True, args=["--sizes", *map(str, BENCH_SIZES), "--repeats", "5",
                                      "--warmup", "1", "--algorithms", *algorithms]).result
    assert all(r["equal"] for r in result["rows"])
    assert sorted({r["algorithm"] for r in result["rows"]}) == sorted(algorithms)
    fastest = {size: sum(r["min_s"] for r in result["rows"] if r["bytes"] == size
                         and r["algorithm"] in BENCH_ALGORITHMS) for size in BENCH_SIZES}
    assert fastest[BENCH_SIZES[-1]] > fastest[BENCH_SIZES[0]]  # all four, fastest calls


# ---- notebook 07 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs():
    def train_runs(n, *splits):
        args = ["--steps", str(STEPS)] + [a for s in splits for a in ("--split", s)]
        return launch("course_lib.demos.dp_training", nproc=n, args=args, timeout_s=300,
                      quiet=True).result["runs"]

    one = train_runs(1, "1:32:ring")
    two = train_runs(2, "1:16:naive", "4:4:ring", "4:4:ring:mean_of_means")
    four = train_runs(4, "2:4:ring")
    return {"1x1x32": one[0], "2x1x16 naive": two[0], "2x4x4": two[1], "4x2x4": four[0],
            "2x4x4 bug": two[2]}


def test_07_every_split_equals_one_process(runs):
    reference = torch.tensor(runs["1x1x32"]["losses"], dtype=torch.float64)
    for label in ("2x1x16 naive", "2x4x4", "4x2x4"):
        run = runs[label]
        assert run["global_batch"] == 32
        losses = torch.tensor(run["losses"], dtype=torch.float64)
        torch.testing.assert_close(losses, reference, rtol=1e-5, atol=1e-5)
        assert run["replicas_bitwise_equal"]
        assert run["tokens"] == runs["1x1x32"]["tokens"]
    assert (runs["4x2x4"]["world_size"], runs["2x1x16 naive"]["sync"]) == (4, "naive")


def test_07_sync_on_the_last_micro_step_only(runs):
    params = list(make_transformer(TransformerConfig(), seed=0).parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    for run in runs.values():
        k, totals = run["accum_steps"], run["sync_totals"]
        assert totals["backward_calls"] == STEPS * k and totals["synced_steps"] == STEPS
        assert totals["collectives"] == STEPS * len(params)
        assert totals["bytes_reduced"] == STEPS * param_bytes  # once per step, whatever K
        assert totals["bytes_reduced"] // totals["backward_calls"] * k == param_bytes


def test_07_token_count_all_reduced(runs):
    batch = global_batch(seed=0, step=0, size=32)
    counts = [[int(count_target_tokens(p.targets)) for p in micro_batches_of_rank(batch, r, 2, 4)]
              for r in range(2)]
    assert sum(map(sum, counts)) == batch.num_targets == runs["2x4x4"]["tokens"][0]
    assert len({t for row in counts for t in row}) > 1


def test_07_per_micro_batch_mean_is_wrong(runs):
    reference = torch.tensor(runs["1x1x32"]["losses"], dtype=torch.float64)
    wrong = torch.tensor(runs["2x4x4 bug"]["losses"], dtype=torch.float64)
    assert runs["2x4x4 bug"]["loss_norm"] == "mean_of_means"
    assert abs(wrong[0] - reference[0]).item() < 1e-5
    assert (wrong - reference).abs().max().item() > 1e-4
