"""Plots for notebook 06b's simulated network (``course_lib.lessons.network_sim``) and for its
measured benchmark, with the spread of the measurements shown, not only their medians.

    from course_lib.lessons import network_plots
    network_plots.plot_algorithms("InfiniBand NDR 400 Gb/s", 1024)   # crossovers marked
    network_plots.plot_world_sizes("InfiniBand NDR 400 Gb/s", 64 * 2**20)
    network_plots.plot_bandwidth_optimal("InfiniBand NDR 400 Gb/s", 1024)
    network_plots.plot_topology("NVLink 4 (H100)", "InfiniBand NDR 400 Gb/s", 64, 2**30)
    network_plots.plot_measured(runs, predicted=network_sim.predict_rows(model, sizes))

Each function returns the matplotlib Figure.
"""

from __future__ import annotations

from typing import Sequence

from course_lib.lessons.links import Cluster, Link, get_link
from course_lib.lessons.network_sim import (
    ANY_WORLD_SIZE,
    FLOAT32,
    crossovers,
    simulate,
    size_grid,
    time_of,
)

COLOURS = {"naive": "tab:red", "ring": "tab:blue", "recursive_doubling": "tab:green",
           "tree": "tab:purple", "halving_doubling": "tab:orange", "two_level": "tab:brown",
           "ring_channels": "tab:cyan", "torch": "black"}
ON_NODES = ("ring", "ring_channels", "two_level")  # plot_topology's three, on a Cluster


def plot_algorithms(link: Link | str, world_size: int, *, low_bytes: int = 1 << 10,
                    high_bytes: int = 1 << 30, points: int = 31,
                    algorithms: Sequence[str] = ANY_WORLD_SIZE, **options):
    """Time against tensor size for each algorithm, log-log, crossovers marked; the Figure."""
    import matplotlib.pyplot as plt

    link = get_link(link)
    sizes = size_grid(low_bytes, high_bytes, points, options.get("element_size", FLOAT32))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in algorithms:
        ax.loglog(sizes, [time_of(name, world_size, b, link, **options) for b in sizes],
                  label=name, color=COLOURS.get(name))
    ranges = crossovers(link, world_size, low_bytes=low_bytes, high_bytes=high_bytes,
                        points=points, algorithms=algorithms, **options)
    for r in ranges[1:]:  # each later range starts where its algorithm takes over
        ax.axvline(r.low_bytes, color="grey", ls=":", lw=1)
        ax.annotate(f"{r.algorithm} from {r.low_bytes:,} B", (r.low_bytes, 0.02),
                    xycoords=("data", "axes fraction"), xytext=(2, 0),
                    textcoords="offset points", rotation=90, fontsize=7, va="bottom")
    ax.set(xlabel="tensor size (bytes)", ylabel="seconds per all-reduce",
           title=f"{world_size} ranks, {link.name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_world_sizes(link: Link | str, nbytes: int,
                     world_sizes: Sequence[int] = tuple(2 ** k for k in range(1, 13)),
                     algorithms: Sequence[str] = ANY_WORLD_SIZE, **options):
    """Time against the number of ranks at one tensor size, log-log; the Figure."""
    import matplotlib.pyplot as plt

    link = get_link(link)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in algorithms:
        ax.loglog(world_sizes, [time_of(name, n, nbytes, link, **options) for n in world_sizes],
                  "o-", ms=3, label=name, color=COLOURS.get(name))
    ax.set(xlabel="ranks (N)", ylabel="seconds per all-reduce",
           title=f"{nbytes:,} bytes, {link.name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_bandwidth_optimal(link: Link | str, world_size: int, *, low_bytes: int = 1 << 10,
                           high_bytes: int = 1 << 30, points: int = 31,
                           algorithms: Sequence[str] = ("ring", "halving_doubling",
                                                        "recursive_doubling")):
    """Each algorithm's time over the bandwidth bound, the time of 2(N-1)/N of the tensor at
    the link's bandwidth, against tensor size; the Figure. A bandwidth-optimal algorithm comes
    down to 1 as the tensor grows (its latencies stop mattering); one that sends more bytes
    levels off above 1."""
    import matplotlib.pyplot as plt

    link = get_link(link)
    sizes = size_grid(low_bytes, high_bytes, points, FLOAT32)
    bound = [2 * (world_size - 1) / world_size * b / link.bandwidth_bytes_per_s for b in sizes]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in algorithms:
        times = [time_of(name, world_size, b, link) for b in sizes]
        ax.loglog(sizes, [t / floor for t, floor in zip(times, bound, strict=True)],
                  label=name, color=COLOURS.get(name))
    ax.axhline(1, color="grey", ls=":", lw=1, label="the bytes alone: 2(N-1)/N x n / bandwidth")
    ax.set(xlabel="tensor size (bytes)", ylabel="time / bandwidth bound",
           title=f"{world_size} ranks, {link.name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_topology(inside: Link | str, between: Link | str, world_size: int, nbytes: int, *,
                  ranks_per_node: int = 8, points: int = 13):
    """A flat ring in one channel, the flat ring in one channel per adapter (ring_channels)
    and a two-level all-reduce, on nodes of ``ranks_per_node``; the Figure.

    Left: time against the bandwidth between nodes, from a quarter of ``between``'s to the
    bandwidth inside a node (the latency stays ``between``'s). Right: with ``between`` itself,
    the bytes the busiest rank sends, in all and between nodes.
    """
    import matplotlib.pyplot as plt

    inside, between = get_link(inside), get_link(between)
    low, high = between.bandwidth_bytes_per_s / 4, inside.bandwidth_bytes_per_s
    bandwidths = [low * (high / low) ** (i / (points - 1)) for i in range(points)]
    labels = {"ring": "ring, 1 channel", "ring_channels": f"ring, {ranks_per_node} channels",
              "two_level": "two_level"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in ON_NODES:
        times = [simulate(name, world_size, nbytes, Cluster(ranks_per_node, inside, Link(
            f"{b / 1e9:.0f} GB/s", b, between.latency_s))).time_s for b in bandwidths]
        left.loglog([b / 1e9 for b in bandwidths], times, "o-", ms=3, label=labels[name],
                    color=COLOURS[name])
    for link in (between, inside):  # the named links, where the sweep meets them
        left.axvline(link.bandwidth_bytes_per_s / 1e9, color="grey", ls=":", lw=1)
        left.annotate(f"{link.name}", (link.bandwidth_bytes_per_s / 1e9, 0.97), fontsize=7,
                      xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right")
    ticks = [round(b / 1e9, 1) for b in bandwidths[::3]]
    left.set_xticks(ticks, [f"{t:g}" for t in ticks])
    left.minorticks_off()
    left.set(xlabel="bandwidth between nodes (GB/s each way)", ylabel="seconds per all-reduce",
             title=f"{world_size} ranks, {ranks_per_node} per node, {nbytes:,} bytes")
    runs = [simulate(name, world_size, nbytes, Cluster(ranks_per_node, inside, between))
            for name in ON_NODES]
    for i, run in enumerate(runs):
        right.bar(i - 0.2, run.max_bytes_sent / nbytes, width=0.4, color=COLOURS[run.algorithm],
                  label="in all" if i == 0 else None)
        right.bar(i + 0.2, max(run.bytes_between_nodes) / nbytes, width=0.4, color="tab:grey",
                  label=f"between nodes ({between.name})" if i == 0 else None)
    right.set_xticks(range(len(runs)), [labels[run.algorithm] for run in runs])
    right.set(ylabel="tensors the busiest rank sends", ylim=(0, 2.6),
              title="bytes sent, as multiples of the tensor")
    for ax in (left, right):
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _spread_points(rows: list[dict], name: str, shift: float):
    """(sizes, medians, lower and upper bar lengths, fastest) of ``name``'s measured rows."""
    mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["bytes"])
    sizes = [r["bytes"] * shift for r in mine]  # shifted a little so the bars do not overlap
    medians = [r["median_s"] for r in mine]
    bars = ([r["median_s"] - r["q1_s"] for r in mine], [r["q3_s"] - r["median_s"] for r in mine])
    return sizes, medians, bars, [r["min_s"] for r in mine]


def plot_measured(runs: dict[int, list[dict]], predicted: dict[int, list[dict]] | None = None,
                  algorithms: Sequence[str] = ("naive", "ring", "recursive_doubling", "torch")):
    """One panel per world size: each algorithm's measured calls, the median as a marker with
    a bar from the first to the third quartile, the fastest call as a small dot; and, when
    ``predicted`` is given (rows of ``network_sim.predict_rows`` or the cost model's, with the
    predicted time in ``median_s``), the prediction as a dashed line.

    ``runs[world_size]`` holds ``bench_all_reduce_worker``'s rows (``median_s``, ``q1_s``,
    ``q3_s``, ``min_s``); "torch" has no prediction (its algorithm is Gloo's choice).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(4.8 * len(runs), 3.8), sharey=True,
                             squeeze=False)
    for ax, (world, rows) in zip(axes[0], sorted(runs.items()), strict=True):
        for i, name in enumerate(algorithms):
            sizes, medians, bars, fastest = _spread_points(rows, name, 1.12 ** i)
            if not sizes:
                continue
            colour = COLOURS.get(name)
            ax.errorbar(sizes, medians, yerr=bars, fmt="o", ms=4, capsize=2, color=colour,
                        label=f"{name} measured")
            ax.plot(sizes, fastest, ".", ms=3, color=colour)
            expected = sorted((r["bytes"], r["median_s"]) for r in (predicted or {}).get(
                world, []) if r["algorithm"] == name)
            if expected:
                ax.plot(*zip(*expected, strict=True), "--", lw=1, color=colour,
                        label=f"{name} predicted")
        ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes)",
               title=f"{world} processes: median, quartiles, fastest (dot)")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("seconds per all-reduce")
    fig.tight_layout()
    return fig
