"""Notebook 05's workers: the collectives tour and the ping-pong, and their pure parts."""

import pytest

from course_lib.demos.collectives_tour import COLLECTIVES, expected_after, start_of, start_values
from course_lib.lessons.cost_model import fit_alpha_beta
from course_lib.runtime.launch import launch


def test_expected_after_follows_each_definition():
    before = [start_values(r, 3) for r in range(3)]  # [[0,1,2], [10,11,12], [20,21,22]]
    assert expected_after("broadcast", before) == [[0.0, 1.0, 2.0]] * 3
    assert expected_after("reduce", before) == [[30.0, 33.0, 36.0], None, None]
    assert expected_after("all_reduce", before) == [[30.0, 33.0, 36.0]] * 3
    assert expected_after("reduce_scatter", before) == [[30.0], [33.0], [36.0]]
    gather_before = [start_of("all_gather", r, 3) for r in range(3)]
    assert gather_before == [[0.0], [11.0], [22.0]]  # each rank's own chunk
    assert expected_after("all_gather", gather_before) == [[0.0, 11.0, 22.0]] * 3
    assert expected_after("broadcast", before, root=2) == [[20.0, 21.0, 22.0]] * 3
    with pytest.raises(ValueError, match="unknown collective"):
        expected_after("all_to_all", before)


@pytest.mark.slow
def test_tour_checks_every_collective_on_every_rank(tour_run):
    run = tour_run  # 4 processes, launched once per session (conftest.py)
    result = run.result
    assert result["world_size"] == 4
    assert [r["rank"] for r in result["ranks"]] == [0, 1, 2, 3]
    assert all(r["master_port_set"] for r in result["ranks"])
    p2p = result["point_to_point"]
    assert p2p["received_by_1"] == p2p["sent"]
    assert p2p["from_left"] == [3.0, 0.0, 1.0, 2.0]  # each rank got its left neighbour's rank
    assert list(result["collectives"]) == list(COLLECTIVES)
    for name, c in result["collectives"].items():
        assert c["ok"] == [True] * 4, name
        expected = expected_after(name, c["before"])
        assert c["after"] == expected, name  # what the ranks reported, checked again here
    rank_2 = expected_after("reduce_scatter", result["collectives"]["reduce_scatter"]["before"])[2]
    assert f"reduce_scatter  rank 2 holds {rank_2}  correct: True" in run.output


@pytest.mark.slow
def test_ping_pong_times_grow_with_size_and_fit_a_line():
    sizes = [8, 65536, 1048576, 4194304]
    run = launch("course_lib.demos.latency_bandwidth", nproc=3, timeout_s=120, quiet=True,
                 args=["--sizes", *map(str, sizes), "--repeats", "10", "--warmup", "2"])
    rows = run.result["rows"]
    assert [r["bytes"] for r in rows] == sizes
    assert all(r["echo_exact"] for r in rows)
    fastest = [r["min_s"] for r in rows]
    assert fastest[-1] > fastest[0]  # 4 MiB takes longer than 8 bytes
    model = fit_alpha_beta(sizes, fastest)
    assert model.beta_s_per_byte > 0 and model.alpha_s >= 0
    big = model.time_s(sizes[-1]) / fastest[-1]
    assert 1 / 4 < big < 4  # the line explains the largest message within a factor of 4
