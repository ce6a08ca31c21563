"""The alpha-beta model of sending a message, and what it predicts for all-reduce
(notebooks 05 and 06b).

    time to send n bytes = alpha + beta x n

alpha is the latency (seconds per message, whatever its size) and beta the seconds per byte
(1 / bandwidth). Notebook 05 measures ping-pong times (``course_lib.demos.latency_bandwidth``)
and fits the two numbers; notebook 06b uses them to predict each all-reduce algorithm:

    from course_lib.lessons.cost_model import fit_alpha_beta, predict_all_reduce_s
    model = fit_alpha_beta(sizes_in_bytes, one_way_seconds)
    model.alpha_s, model.bandwidth_bytes_per_s
    latencies_and_bytes("ring", nbytes=4 * 2**20, world_size=4)   # (6, 6291456.0)
    predict_all_reduce_s(model, "ring", nbytes=4 * 2**20, world_size=4)

An all-reduce then costs (latencies in a row) x alpha + (bytes in a row) x beta: the messages
one rank sends or waits for one after the other, and their bytes.

Everything here is plain arithmetic on numbers: no processes, no timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

ALGORITHMS = ("naive", "ring", "recursive_doubling")  # as course_lib.core.collectives runs them


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted cost model: ``time_s(n) = alpha_s + beta_s_per_byte * n``."""

    alpha_s: float  # latency: the cost of one message of any size, in seconds
    beta_s_per_byte: float  # the cost of one more byte, in seconds (1 / bandwidth)

    def time_s(self, nbytes: float) -> float:
        """Predicted seconds to send one message of ``nbytes`` bytes."""
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    @property
    def half_bandwidth_bytes(self) -> float:
        """The size at which latency and bandwidth cost the same (alpha = beta x n)."""
        return self.alpha_s / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf


def _check_measurements(nbytes: Sequence[float], seconds: Sequence[float]) -> None:
    if len(nbytes) != len(seconds):
        raise ValueError(f"got {len(nbytes)} sizes but {len(seconds)} times; pass one time "
                         "per message size")
    if len(set(nbytes)) < 2:
        raise ValueError("fitting alpha and beta needs at least two different message sizes")
    if any(n < 0 for n in nbytes) or any(not t > 0 for t in seconds):
        raise ValueError("sizes must be >= 0 bytes and times > 0 seconds")


def _weighted_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float]:
    """Intercept and slope minimising sum w (y - a - b x)^2 (closed form)."""
    points = list(zip(ws, xs, ys, strict=True))
    total = sum(ws)
    mean_x = sum(w * x for w, x, _ in points) / total
    mean_y = sum(w * y for w, _, y in points) / total
    spread = sum(w * (x - mean_x) ** 2 for w, x, _ in points)
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, x, y in points) / spread
    return mean_y - slope * mean_x, slope


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Fit ``seconds ~ alpha + beta x nbytes`` by weighted least squares.

    Plain least squares listens only to the largest (slowest) messages, and least squares on
    relative errors only to the many small ones. Dividing each squared miss by the measured
    time sits between the two: both ends count. A negative intercept (noise) is not a
    latency: alpha is then 0 and beta is refitted through 0.
    """
    _check_measurements(nbytes, seconds)
    xs, ys = [float(n) for n in nbytes], [float(t) for t in seconds]
    ws = [1.0 / t for t in ys]  # a miss of d seconds counts d^2 / t
    alpha, beta = _weighted_line(xs, ys, ws)
    if alpha < 0:
        alpha = 0.0  # through the origin: beta = sum w x y / sum w x^2
        points = list(zip(ws, xs, ys, strict=True))
        beta = sum(w * x * y for w, x, y in points) / sum(w * x * x for w, x, _ in points)
    return AlphaBeta(alpha, beta)


def relative_errors(model: AlphaBeta, nbytes: Sequence[float],
                    seconds: Sequence[float]) -> list[float]:
    """(predicted - measured) / measured for each size: how well the line explains the data."""
    return [(model.time_s(n) - t) / t for n, t in zip(nbytes, seconds, strict=True)]


def _check_algorithm(algorithm: str, world_size: int) -> None:
    known = ALGORITHMS + ("halving_doubling",)
    if algorithm not in known:
        raise ValueError(f"unknown algorithm {algorithm!r}; pick one of {known}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if algorithm == "halving_doubling" and world_size & (world_size - 1):
        raise ValueError(f"halving_doubling needs a power-of-two world size, got {world_size}")


def all_reduce_messages(algorithm: str, nbytes: float, world_size: int) -> tuple[int, float]:
    """``(messages, bytes per message)`` on the slowest rank's path, one after the other.

    naive: rank 0 receives N-1 whole tensors, then sends N-1 back.
    ring: 2(N-1) steps (reduce-scatter, then all-gather), each moving one chunk of n/N bytes.
    recursive_doubling: log2(N) swaps of the whole tensor; a world size that is not a power
    of two adds one fold and one unfold.
    (halving_doubling's messages differ in size: see ``latencies_and_bytes``.)
    """
    if algorithm == "halving_doubling":
        raise ValueError("halving_doubling's messages are n/2, n/4, ..., n/N bytes, not one "
                         "size: use latencies_and_bytes")
    _check_algorithm(algorithm, world_size)
    if world_size == 1:
        return 0, 0.0  # nothing to send
    n = world_size
    if algorithm == "naive":
        return 2 * (n - 1), float(nbytes)
    if algorithm == "ring":
        return 2 * (n - 1), nbytes / n  # each step moves one of the N chunks
    rounds = n.bit_length() - 1  # log2 of the largest power of two <= N
    extra = 0 if n & (n - 1) == 0 else 2  # fold the extra ranks in, and back out
    return rounds + extra, float(nbytes)


def latencies_and_bytes(algorithm: str, nbytes: float, world_size: int) -> tuple[int, float]:
    """``(latencies, bytes)`` in a row on the slowest rank's path: the time is
    latencies x alpha + bytes x beta.

    The ring and halving-doubling both move 2(N-1)/N of the tensor (bandwidth-optimal); the
    ring pays 2(N-1) latencies for it, halving-doubling 2 log2(N) (messages of n/2, n/4, ...,
    n/N bytes, then back up). Naive and recursive doubling send whole tensors.
    """
    _check_algorithm(algorithm, world_size)
    if algorithm != "halving_doubling":
        messages, per_message = all_reduce_messages(algorithm, nbytes, world_size)
        return messages, messages * per_message
    rounds = world_size.bit_length() - 1  # log2(N)
    return 2 * rounds, 2 * (world_size - 1) / world_size * nbytes


def predict_all_reduce_s(model: AlphaBeta, algorithm: str, nbytes: float,
                         world_size: int) -> float:
    """Seconds the alpha-beta model predicts for one all-reduce of ``nbytes`` bytes.

    Each message costs alpha + beta x its bytes; the adds on the CPU are not counted.
    """
    latencies, in_a_row = latencies_and_bytes(algorithm, nbytes, world_size)
    return latencies * model.alpha_s + in_a_row * model.beta_s_per_byte


def ring_bytes_fraction(world_size: int) -> float:
    """2(N-1)/N: the share of the tensor's bytes each rank sends in a ring all-reduce."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    return 2 * (world_size - 1) / world_size


def plot_fit(nbytes: Sequence[float], measured: dict[str, Sequence[float]], model: AlphaBeta,
             title: str = "one message: measured and alpha + beta x n",
             spread: tuple[Sequence[float], Sequence[float]] | None = None):
    """Measured times (one series per label) and the fitted line, on log-log axes.

    ``spread``: (first quartiles, third quartiles), drawn as a bar on each size.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    if spread is not None:
        for n, low, high in zip(nbytes, *spread, strict=True):
            ax.plot([n, n], [low, high], color="tab:grey", lw=3, alpha=0.5)
        ax.plot([], [], color="tab:grey", lw=3, alpha=0.5, label="middle half of the repeats")
    for (label, times), marker in zip(measured.items(), "os^", strict=False):
        ax.loglog(nbytes, times, marker, ls="", ms=5, label=label)
    grid = [min(nbytes) * (max(nbytes) / min(nbytes)) ** (i / 50) for i in range(51)]
    ax.loglog(grid, [model.time_s(n) for n in grid], "-", color="black", lw=1,
              label="fit: alpha + beta x n")
    ax.axvline(model.half_bandwidth_bytes, color="grey", ls=":", lw=1,
               label="alpha = beta x n")
    ax.set(xlabel="message size (bytes)", ylabel="seconds, one way", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_benchmark(runs: dict[int, list[dict]], model: AlphaBeta,
                   algorithms: Sequence[str] = ("naive", "ring", "torch")):
    """One panel per world size: measured all-reduce times (markers) and the model (lines).

    ``runs[world_size]`` holds rows ``{"algorithm", "bytes", "median_s"}``; "torch" has no
    prediction (its algorithm is Gloo's or NCCL's choice).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 3.6), sharey=True,
                             squeeze=False)
    colours = {"naive": "tab:red", "ring": "tab:blue", "recursive_doubling": "tab:green",
               "torch": "black"}
    for ax, (world, rows) in zip(axes[0], sorted(runs.items()), strict=True):
        for name in algorithms:
            mine = sorted((r["bytes"], r["median_s"]) for r in rows if r["algorithm"] == name)
            if not mine:
                continue
            sizes = [b for b, _ in mine]
            ax.loglog(sizes, [t for _, t in mine], "o", color=colours.get(name), ms=5,
                      label=f"{name} measured")
            if name in ALGORITHMS:
                ax.loglog(sizes, [predict_all_reduce_s(model, name, b, world) for b in sizes],
                          "--", color=colours.get(name), lw=1, label=f"{name} model")
        ax.set(xlabel="tensor size (bytes)", title=f"{world} processes")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("seconds per all-reduce")
    fig.tight_layout()
    return fig
