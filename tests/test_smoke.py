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
