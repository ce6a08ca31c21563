"""Notebook 04's claims: replicas stay bitwise identical and equal the big batch; skipping the
sync or initialising differently breaks it; linear scaling and warmup."""

import pytest
import torch
import torch.nn.functional as F

from course_lib.lessons import gradients, replicas
from course_lib.tasks import toy


@pytest.fixture(scope="module")
def setup():
    model = toy.make_mlp(hidden=32, norm="layer", seed=0)
    x, y = toy.two_moons(1024, seed=0)
    batches = toy.batches(x, y, 64, steps=8, seed=0)
    single, losses = replicas.train_single(model, batches, lr=0.2)
    return model, batches, single, losses


def params(model):
    return list(model.parameters())


@pytest.mark.parametrize("world, accum", [(1, 1), (2, 1), (4, 1), (4, 2), (8, 4), (2, 8)])
def test_replicas_identical_after_each_step_and_equal_to_the_big_batch(setup, world, accum):
    model, batches, single, losses = setup
    run = replicas.train_replicas(model, batches, world, lr=0.2, accum_steps=accum)
    assert len(run["identical"]) == 8 and all(run["identical"])
    assert all(gap == 0.0 for gap in run["difference"])
    torch.testing.assert_close(run["losses"], losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(params(run["replicas"][0]), params(single), rtol=1e-5, atol=1e-5)


def test_float64_matches_to_1e_12(setup):
    model, batches, _, _ = setup
    model64 = toy.make_mlp(hidden=32, norm="layer", seed=0, dtype=torch.float64)
    batches64 = [(x.double(), y) for x, y in batches]
    run = replicas.train_replicas(model64, batches64, 4, lr=0.2, accum_steps=2)
    single, _ = replicas.train_single(model64, batches64, lr=0.2)
    torch.testing.assert_close(params(run["replicas"][0]), params(single), rtol=1e-12, atol=1e-12)


def test_no_sync_drifts_and_different_init_never_meets(setup):
    model, batches, single, _ = setup
    reference = gradients.flatten(params(single))
    drift = replicas.train_replicas(model, batches, 4, lr=0.2, sync=False)
    assert drift["difference"][0] > 1e-3 and drift["difference"][-1] > drift["difference"][0]
    assert not any(drift["identical"])
    apart = replicas.train_replicas(model, batches, 4, lr=0.2, same_init=False)
    assert min(apart["difference"]) > 0.1
    gap = apart["difference"]  # the same vector added to each replica: the gap stays put
    assert max(gap) - min(gap) <= 1e-6 * max(gap)
    for run in (drift, apart):
        ours = gradients.flatten(params(run["replicas"][0]))
        assert gradients.relative_error(ours, reference) > 1e-2


def test_the_hand_written_step_of_the_notebook(setup):
    model, batches, _, _ = setup
    x, y = batches[0]
    ranks = replicas.make_replicas(model, 4)
    for rank, replica in enumerate(ranks):
        F.cross_entropy(replica(replicas.shard(x, rank, 4)), replicas.shard(y, rank, 4)).backward()
    assert not replicas.replicas_identical([_grads_module(r) for r in ranks])
    replicas.average_gradients(ranks)
    torch.testing.assert_close(gradients.flat_grad(ranks[2]), gradients.batch_grad(model, x, y),
                               rtol=1e-5, atol=1e-7)
    assert all(torch.equal(a.grad, b.grad) for r in ranks[1:]
               for a, b in zip(ranks[0].parameters(), r.parameters(), strict=True))


def _grads_module(model):
    holder = torch.nn.Module()
    holder.g = torch.nn.ParameterList(torch.nn.Parameter(p.grad.clone())
                                      for p in model.parameters())
    return holder


def test_shard_and_batch_sizes():
    x = torch.arange(12)
    assert torch.equal(replicas.shard(x, 1, 3), torch.tensor([4, 5, 6, 7]))
    assert replicas.global_batch_size(4, 2, 8) == 64
    with pytest.raises(ValueError, match="accum_steps=0"):
        replicas.global_batch_size(4, 0, 8)
    with pytest.raises(ValueError, match="not divisible by world_size 5"):
        replicas.shard(x, 0, 5)
    model = toy.make_mlp(hidden=8)
    with pytest.raises(ValueError, match="world_size 3"):
        replicas.data_parallel_step(replicas.make_replicas(model, 3), [], *toy.two_moons(64))


def test_linear_scaling_wins_back_most_of_the_gap():
    model = toy.make_mlp(hidden=32, norm="layer", seed=0)
    x, y = toy.two_moons(2048, seed=0, noise=0.15)
    loss_on_all = lambda m: F.cross_entropy(m(x), y)
    assert replicas.scaled_lr(0.01, 16, 256) == pytest.approx(0.16)
    final = []
    for size, lr in ((16, 0.01), (256, 0.01), (256, replicas.scaled_lr(0.01, 16, 256))):
        data = toy.batches(x, y, size, 4096 // size, seed=1)
        final.append(replicas.train_single(model, data, lr, evaluate=loss_on_all)[1][-1])
    small, plain, scaled = final
    assert plain - scaled > 0.8 * (plain - small)


def test_warmup_schedule():
    schedule = [replicas.warmup_lr(step, 0.32, 4) for step in range(8)]
    assert schedule[0] == pytest.approx(0.08) and schedule[0] > 0
    assert schedule[3] == 0.32 and max(schedule) == 0.32 and schedule[-1] == 0.32
    assert replicas.warmup_lr(0, 0.5, 0) == 0.5
