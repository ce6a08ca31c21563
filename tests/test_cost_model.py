"""The alpha-beta model: the fit recovers known lines, predictions follow the message counts."""

import math

import pytest

from course_lib.lessons.cost_model import (
    AlphaBeta,
    all_reduce_messages,
    fit_alpha_beta,
    latencies_and_bytes,
    predict_all_reduce_s,
    relative_errors,
    ring_bytes_fraction,
)

SIZES = [8, 1024, 16384, 262144, 1048576, 4194304]


def test_fit_recovers_an_exact_line():
    alpha, beta = 50e-6, 1 / 2e9  # 50 us, 2 GB/s
    times = [alpha + beta * n for n in SIZES]
    model = fit_alpha_beta(SIZES, times)
    assert model.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert model.beta_s_per_byte == pytest.approx(beta, rel=1e-9)
    assert model.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-9)
    assert model.half_bandwidth_bytes == pytest.approx(alpha / beta, rel=1e-9)
    assert max(abs(e) for e in relative_errors(model, SIZES, times)) < 1e-9


def test_noisy_fit_keeps_both_ends():
    """10 % noise on every point: alpha (small messages) and beta (large ones) stay close."""
    alpha, beta = 50e-6, 1 / 2e9
    noise = [1.1, 0.9, 1.1, 0.9, 1.1, 0.9]
    times = [(alpha + beta * n) * k for n, k in zip(SIZES, noise, strict=True)]
    model = fit_alpha_beta(SIZES, times)
    assert model.alpha_s == pytest.approx(alpha, rel=0.15)
    assert model.beta_s_per_byte == pytest.approx(beta, rel=0.15)
    assert max(abs(e) for e in relative_errors(model, SIZES, times)) < 0.2


def test_negative_intercept_becomes_zero_latency():
    sizes = [1000, 2000, 3000]
    times = [1e-9 * n - 0.5e-6 for n in sizes]  # a line that crosses 0 above 0 bytes
    model = fit_alpha_beta(sizes, times)
    assert model.alpha_s == 0.0
    assert 1e-9 * 0.5 < model.beta_s_per_byte < 1e-9  # through the origin: a lower slope


@pytest.mark.parametrize("sizes, times, match", [
    ([8, 16], [1.0], "one time per message size"),
    ([8, 8], [1.0, 2.0], "two different message sizes"),
    ([8, 16], [1.0, 0.0], "times > 0"),
])
def test_fit_rejects_bad_measurements(sizes, times, match):
    with pytest.raises(ValueError, match=match):
        fit_alpha_beta(sizes, times)


def test_message_counts_follow_each_algorithm():
    n = 1 << 20
    assert all_reduce_messages("naive", n, 4) == (6, n)  # 3 in, 3 out at rank 0
    assert all_reduce_messages("ring", n, 4) == (6, n / 4)  # 2(N-1) chunks of n/N
    assert all_reduce_messages("recursive_doubling", n, 4) == (2, n)  # log2(4) swaps
    assert all_reduce_messages("recursive_doubling", n, 6) == (4, n)  # + fold and unfold
    assert all_reduce_messages("ring", n, 1) == (0, 0.0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        all_reduce_messages("tree", n, 4)


def test_latencies_and_bytes_in_a_row():
    n = 1 << 20
    assert latencies_and_bytes("naive", n, 4) == (6, 6 * n)
    assert latencies_and_bytes("ring", n, 4) == (6, 1.5 * n)  # 2(N-1) chunks of n/N
    assert latencies_and_bytes("recursive_doubling", n, 8) == (3, 3 * n)
    assert latencies_and_bytes("halving_doubling", n, 8) == (6, 1.75 * n)  # the ring's bytes
    assert latencies_and_bytes("halving_doubling", n, 1024) == (20, 2 * 1023 / 1024 * n)
    assert latencies_and_bytes("halving_doubling", n, 1) == (0, 0.0)
    model = AlphaBeta(alpha_s=20e-6, beta_s_per_byte=1e-9)
    for name in ("naive", "ring", "recursive_doubling"):  # the same as message by message
        messages, per_message = all_reduce_messages(name, n, 6)
        assert predict_all_reduce_s(model, name, n, 6) == pytest.approx(
            messages * model.time_s(per_message))
    assert predict_all_reduce_s(model, "halving_doubling", n, 8) == pytest.approx(
        6 * 20e-6 + 1.75 * n * 1e-9)


@pytest.mark.parametrize("call, match", [
    (lambda: latencies_and_bytes("halving_doubling", 64, 6), "power-of-two world size, got 6"),
    (lambda: all_reduce_messages("halving_doubling", 64, 8), "use latencies_and_bytes"),
    (lambda: latencies_and_bytes("butterfly", 64, 8), "unknown algorithm"),
    (lambda: latencies_and_bytes("ring", 64, 0), "world_size"),
])
def test_bad_algorithm_or_world_size_says_what_to_pass(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_predictions_rank_the_algorithms_as_the_theory_says():
    model = AlphaBeta(alpha_s=20e-6, beta_s_per_byte=1e-9)
    big, small = 64 * 2**20, 64
    for world in (2, 4, 8):
        ring = predict_all_reduce_s(model, "ring", big, world)
        naive = predict_all_reduce_s(model, "naive", big, world)
        assert ring < naive  # big tensors: the ring's N-fold smaller messages win
    # small tensors: latency rules, and recursive doubling sends fewest messages
    assert (predict_all_reduce_s(model, "recursive_doubling", small, 8)
            < predict_all_reduce_s(model, "ring", small, 8))
    # the ring's time hardly grows with N for big tensors: 2(N-1)/N -> 2
    r4, r8 = (predict_all_reduce_s(model, "ring", big, w) for w in (4, 8))
    assert r8 / r4 < 1.2


def test_ring_fraction():
    assert ring_bytes_fraction(1) == 0
    assert ring_bytes_fraction(2) == 1
    assert ring_bytes_fraction(4) == 1.5
    assert math.isclose(ring_bytes_fraction(1000), 1.998)
    with pytest.raises(ValueError):
        ring_bytes_fraction(0)
