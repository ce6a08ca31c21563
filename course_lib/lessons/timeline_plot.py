"""The timeline picture of notebook 08: backward on one lane, each bucket's all-reduce on a lane
of its own, drawn from the events a ``CommRecorder`` records (course_lib.lessons.timeline).

    from course_lib.lessons.timeline_plot import timeline_bars, plot_timelines
    bars = timeline_bars(gs.timeline)          # pure: lanes, labels, start and end in ms
    plot_timelines({"bucketed": events_a, "overlap": events_b})

An event is ``{"name", "kind": "compute" | "comm", "start_s", "end_s", "bytes"}`` with times in
seconds from the start of backward (``course_lib.lessons.timeline``).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

COLOURS = {"compute": "tab:blue", "comm": "tab:orange"}


def _natural_key(name: str) -> tuple:
    """"bucket 10" after "bucket 9": numbers compare as numbers."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def check_events(events: Sequence[Mapping]) -> None:
    """A clear error for events that cannot be drawn."""
    for e in events:
        missing = {"name", "kind", "start_s", "end_s"} - set(e)
        if missing:
            raise ValueError(f"event {dict(e)} lacks {sorted(missing)}; pass gs.timeline")
        if e["kind"] not in COLOURS:
            raise ValueError(f"event {e['name']!r} has kind {e['kind']!r}; "
                             f"expected one of {sorted(COLOURS)}")
        if e["end_s"] is None or e["end_s"] < e["start_s"]:
            raise ValueError(f"event {e['name']!r} has no end (or ends before it starts): "
                             "take the timeline after gs.finish()")


def timeline_bars(events: Sequence[Mapping]) -> list[dict]:
    """One bar per event: lane 0 is compute (backward), then one lane per collective, in the
    order of their names (bucket 0 first). Times in milliseconds."""
    check_events(events)
    comm_names = sorted({e["name"] for e in events if e["kind"] == "comm"}, key=_natural_key)
    lane_of = {name: i + 1 for i, name in enumerate(comm_names)}
    bars = []
    for e in events:
        lane = 0 if e["kind"] == "compute" else lane_of[e["name"]]
        bars.append({"lane": lane, "label": e["name"], "kind": e["kind"],
                     "start_ms": 1000 * e["start_s"], "end_ms": 1000 * e["end_s"]})
    return sorted(bars, key=lambda b: (b["lane"], b["start_ms"]))


def backward_end_s(events: Sequence[Mapping]) -> float:
    """When the last compute event (backward) ended."""
    ends = [e["end_s"] for e in events if e["kind"] == "compute"]
    if not ends:
        raise ValueError("the timeline has no compute event; pass gs.timeline of a synced step")
    return max(ends)


def first_comm_start_s(events: Sequence[Mapping]) -> float:
    """When the first collective started."""
    starts = [e["start_s"] for e in events if e["kind"] == "comm"]
    if not starts:
        raise ValueError("the timeline has no communication event")
    return min(starts)


def comm_starts_before_backward_ends(events: Sequence[Mapping]) -> bool:
    """True when communication began while backward was still running: overlap."""
    return first_comm_start_s(events) < backward_end_s(events)


def plot_timeline(events: Sequence[Mapping], ax=None, title: str | None = None,
                  max_lanes: int = 12):
    """Draw ``timeline_bars(events)`` on ``ax`` (a new figure when None); returns the axes.

    With more than ``max_lanes`` collectives (one per parameter) they share one lane.
    """
    import matplotlib.pyplot as plt

    bars = timeline_bars(events)
    lanes = max(b["lane"] for b in bars)
    squash = lanes > max_lanes  # too many lanes to read: one communication lane
    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 0.45 * (2 if squash else lanes + 1) + 1.0))
    names = {0: "backward"}
    for b in bars:
        lane = min(b["lane"], 1) if squash else b["lane"]
        names.setdefault(lane, "all-reduces" if squash else b["label"])
        ax.broken_barh([(b["start_ms"], b["end_ms"] - b["start_ms"])], (-lane - 0.35, 0.7),
                       facecolors=COLOURS[b["kind"]], edgecolor="black", linewidth=0.4)
    ticks = sorted(names)
    ax.set_yticks([-t for t in ticks], [names[t] for t in ticks])
    ax.axvline(1000 * backward_end_s(events), color="tab:blue", linestyle=":", linewidth=1)
    ax.set_xlabel("time since backward started (ms)")
    if title:
        ax.set_title(title)
    return ax


def plot_timelines(named_events: Mapping[str, Sequence[Mapping]]):
    """One timeline per entry, stacked, sharing the time axis; returns the figure."""
    import matplotlib.pyplot as plt

    heights = [len({e["name"] for e in ev if e["kind"] == "comm"}) + 1
               for ev in named_events.values()]
    heights = [min(h, 13) for h in heights]
    fig, axes = plt.subplots(len(named_events), 1, sharex=True, squeeze=False,
                             figsize=(7.0, 0.35 * sum(heights) + 1.2 * len(heights)),
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, events) in zip(axes[:, 0], named_events.items(), strict=True):
        plot_timeline(events, ax=ax, title=title)
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("time since backward started (ms)")
    fig.tight_layout()
    return fig
