"""Notebook 00's smoke test: one all-reduce on every rank, before anything else runs."""

import pytest

from course_lib.runtime.launch import launch


@pytest.mark.slow
def test_the_smoke_test_all_reduces_on_every_rank_and_says_so():
    run = launch("course_lib.demos.smoke", nproc=3, timeout_s=120, quiet=True)
    assert run.returncode == 0
    assert sorted(r["rank"] for r in run.result) == [0, 1, 2]
    assert all(r["ok"] and r["backend"] == "gloo" for r in run.result)  # 1 + 2 + 3 everywhere
    assert "all-reduce on cpu (gloo) gave 6 everywhere" in run.output
    assert "smoke test: 3 of 3 ranks right" in run.output


@pytest.mark.slow
def test_gloo_on_another_device_is_compared_with_the_cpu_collective_by_collective():
    """scripts/gpu_check.sh runs it on one GPU shared by 2-4 ranks; here both sides are the
    CPU, so every collective must come out equal, bit for bit, on every rank."""
    run = launch("course_lib.demos.cuda_gloo", nproc=2, args=["--device", "cpu"],
                 timeout_s=120, quiet=True)
    names = {row["collective"] for row in run.result}
    assert names == {"dist.all_reduce", "naive_all_reduce", "ring_all_reduce",
                     "recursive_doubling"}
    assert len(run.result) == 2 * len(names)
    assert all(row["error"] is None and row["max_difference"] == 0 for row in run.result)
    assert run.output.count("equal to the CPU's, bit for bit") == len(names)
