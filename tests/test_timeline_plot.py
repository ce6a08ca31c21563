"""The timeline picture of notebook 08: lanes, ordering, the overlap test, and the drawing."""

import matplotlib
import pytest
import torch

from course_lib.lessons.timeline_plot import (
    backward_end_s,
    comm_starts_before_backward_ends,
    first_comm_start_s,
    plot_timeline,
    plot_timelines,
    timeline_bars,
)

matplotlib.use("Agg")


def event(name, kind, start, end, nbytes=0):
    return {"name": name, "kind": kind, "start_s": start, "end_s": end, "bytes": nbytes}


OVERLAP = [event("backward", "compute", 0.0, 0.010),
           event("bucket 0", "comm", 0.004, 0.008, 400),
           event("bucket 1", "comm", 0.008, 0.013, 400)]
AFTER = [event("backward", "compute", 0.0, 0.010),
         event("bucket 0", "comm", 0.011, 0.015, 800)]


def test_bars_put_backward_first_and_one_lane_per_bucket_in_numeric_order():
    events = [event("backward", "compute", 0.0, 0.02)]
    events += [event(f"bucket {i}", "comm", 0.001 * i, 0.001 * i + 0.0005) for i in (10, 2, 9)]
    bars = timeline_bars(events)
    assert [(b["lane"], b["label"]) for b in bars] == [
        (0, "backward"), (1, "bucket 2"), (2, "bucket 9"), (3, "bucket 10")]
    assert bars[3]["start_ms"] == pytest.approx(10.0)
    assert bars[3]["end_ms"] == pytest.approx(10.5)


def test_overlap_is_seen_only_when_communication_starts_during_backward():
    assert backward_end_s(OVERLAP) == pytest.approx(0.010)
    assert first_comm_start_s(OVERLAP) == pytest.approx(0.004)
    assert comm_starts_before_backward_ends(OVERLAP) is True
    assert comm_starts_before_backward_ends(AFTER) is False


@pytest.mark.parametrize("bad, message", [
    ([event("bucket 0", "comm", 0.0, None)], "after gs.finish"),
    ([{"name": "x", "kind": "comm", "start_s": 0.0}], "lacks"),
    ([event("x", "disk", 0.0, 1.0)], "kind"),
])
def test_bad_events_get_a_clear_error(bad, message):
    with pytest.raises(ValueError, match=message):
        timeline_bars(bad)


def test_missing_lanes_are_named():
    with pytest.raises(ValueError, match="no compute event"):
        backward_end_s(AFTER[1:])
    with pytest.raises(ValueError, match="no communication"):
        first_comm_start_s(AFTER[:1])


def test_plot_draws_one_bar_per_event_and_names_each_lane():
    ax = plot_timeline(OVERLAP, title="overlap")
    assert len(ax.collections) == len(OVERLAP)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["backward", "bucket 0", "bucket 1"]
    matplotlib.pyplot.close("all")


def test_many_collectives_share_one_lane():
    events = [event("backward", "compute", 0.0, 0.05)]
    events += [event(f"layer.{i}.weight", "comm", 0.05 + i * 1e-3, 0.05 + (i + 1) * 1e-3)
               for i in range(20)]
    ax = plot_timeline(events, max_lanes=12)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["backward", "all-reduces"]
    fig = plot_timelines({"per parameter": events, "overlap": OVERLAP})
    assert len(fig.axes) == 2
    matplotlib.pyplot.close("all")


def test_a_real_overlap_timeline_draws(one_process_group):
    from course_lib.core.overlap import OverlapDataParallel
    from course_lib.lessons.timeline import CommRecorder

    recorder = CommRecorder(torch.distributed.all_reduce)
    module = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])  # small
    model = OverlapDataParallel(module, one_process_group, bucket_cap_mb=0.02, all_reduce=recorder)
    loss = model(torch.randn(8, 64)).square().mean()
    recorder.start_step()
    with recorder.compute("backward"):
        loss.backward()
    model.finish_gradient_sync()
    recorder.settle()
    bars = timeline_bars(recorder.events)
    assert bars[0]["label"] == "backward"
    assert len({b["lane"] for b in bars}) == len(model.buckets) + 1
    assert comm_starts_before_backward_ends(recorder.events)  # bucket 0 left during backward
    recorder.close()
