"""Plots for notebook 06's simulated network (``course_lib.lessons.network_sim``) and for its
measured benchmark, with the spread of the measurements shown, not only their medians.

    from course_lib.lessons import network_plots
    network_plots.plot_algorithms("InfiniBand NDR 400 Gb/s", 1024)   # crossovers marked
    network_plots.plot_world_sizes("InfiniBand NDR 400 Gb/s", 64 * 2**20)
    network_plots.plot_measured(runs, predicted=network_sim.predict_rows(model, sizes))

Each function returns the matplotlib Figure.
"""

from __future__ import annotations

from typing import Sequence

from course_lib.lessons.links import Link, get_link
from course_lib.lessons.network_sim import ALGORITHMS, FLOAT32, crossovers, simulate, size_grid

COLOURS = {"naive": "tab:red", "ring": "tab:blue", "recursive_doubling": "tab:green",
           "tree": "tab:purple", "torch": "black"}


def plot_algorithms(link: Link | str, world_size: int, *, low_bytes: int = 1 << 10,
                    high_bytes: int = 1 << 30, points: int = 31,
                    algorithms: Sequence[str] = ALGORITHMS, **options):
    """Time against tensor size for each algorithm, log-log, crossovers marked; the Figure."""
    import matplotlib.pyplot as plt

    link = get_link(link)
    sizes = size_grid(low_bytes, high_bytes, points, options.get("element_size", FLOAT32))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in algorithms:
        ax.loglog(sizes, [simulate(name, world_size, b, link, **options).time_s
                          for b in sizes], label=name, color=COLOURS.get(name))
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
                     algorithms: Sequence[str] = ALGORITHMS, **options):
    """Time against the number of ranks at one tensor size, log-log; the Figure."""
    import matplotlib.pyplot as plt

    link = get_link(link)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in algorithms:
        ax.loglog(world_sizes, [simulate(name, n, nbytes, link, **options).time_s
                                for n in world_sizes], "o-", ms=3, label=name,
                  color=COLOURS.get(name))
    ax.set(xlabel="ranks (N)", ylabel="seconds per all-reduce",
           title=f"{nbytes:,} bytes, {link.name}")
    ax.legend(fontsize=8)
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
    ``predicted`` is given (``network_sim.predict_rows``), the simulated time as a dashed line.

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
            simulated = sorted((r["bytes"], r["median_s"]) for r in (predicted or {}).get(
                world, []) if r["algorithm"] == name)
            if simulated:
                ax.plot(*zip(*simulated, strict=True), "--", lw=1, color=colour,
                        label=f"{name} simulated")
        ax.set(xscale="log", yscale="log", xlabel="tensor size (bytes)",
               title=f"{world} processes: median, quartiles, fastest (dot)")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("seconds per all-reduce")
    fig.tight_layout()
    return fig
