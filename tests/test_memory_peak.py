"""SavedTensorPeak: the peak over accumulation is one micro-batch's, not the sum of all."""

import torch
import torch.nn as nn

from course_lib.lessons.memory_peak import SavedTensorPeak


def mlp():  # small for test speed
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def peak_of(model, batches, backward_each=True):
    with SavedTensorPeak(exclude=model.parameters()) as peak:
        losses = []
        for x in batches:
            loss = model(x).square().mean()
            if backward_each:
                loss.backward()
            else:
                losses.append(loss)
        if not backward_each:
            sum(losses).backward()
    return peak


def test_accumulation_peak_is_one_micro_batch_and_grows_with_batch():
    model = mlp()
    x = torch.randn(64, 16)
    parts = [p.clone() for p in x.split(16)]  # own storages: a view would keep all of x alive
    one_small = peak_of(model, parts[:1]).peak_bytes
    four_small = peak_of(model, parts).peak_bytes
    one_big = peak_of(model, [x]).peak_bytes
    assert one_small > 0
    assert four_small == one_small  # each backward freed its graph before the next forward
    assert one_big >= 3.5 * one_small  # activations grow with the batch
    kept = peak_of(model, parts, backward_each=False).peak_bytes
    assert kept >= 3.5 * one_small  # graphs kept alive until one backward add up


def test_everything_is_released_after_backward():
    model = mlp()
    peak = peak_of(model, [torch.randn(8, 16)])
    assert peak.live_bytes == 0 and not peak.holders
