"""DDP in practice (notebook 09): where no_sync must go, DistributedSampler and set_epoch,
BatchNorm over the global batch, and our trainer against DDP."""

import pytest
import torch
from torch import nn

from course_lib.demos.ddp_practice import PLACEMENTS, sampler_orders, sync_batch_norm
from course_lib.runtime.launch import launch


def test_sampler_shards_are_disjoint_and_cover_the_dataset():
    for rank_orders in sampler_orders(12, 3, epochs=2, set_epoch=True):
        together = sorted(i for order in rank_orders for i in order)
        assert together == list(range(12))


def test_sampler_pads_by_repeating_when_sizes_do_not_divide():
    orders = sampler_orders(10, 3, epochs=1, set_epoch=True)[0]
    assert [len(o) for o in orders] == [4, 4, 4]  # 12 places for 10 examples
    together = [i for order in orders for i in order]
    assert sorted(set(together)) == list(range(10)) and len(together) == 12


def test_without_set_epoch_every_epoch_repeats_the_same_order():
    same = sampler_orders(16, 2, epochs=3, set_epoch=False)
    assert same[0] == same[1] == same[2]
    fresh = sampler_orders(16, 2, epochs=3, set_epoch=True)
    assert fresh[0] == same[0]  # epoch 0 is seed + 0 either way
    assert fresh[1] != fresh[0] and fresh[2] != fresh[1]


def test_sync_batch_norm_on_one_rank_is_batch_norm(one_process_group):
    x = 3 + 2 * torch.randn(12, 4)
    bn = nn.BatchNorm1d(4)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ref = bn(x1)
    out = sync_batch_norm(x2, bn.weight, bn.bias, one_process_group)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    weights = torch.randn(12, 4)
    (out_ref * weights).sum().backward()
    (out * weights).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def report():
    return launch("course_lib.demos.ddp_practice", nproc=2, timeout_s=180, quiet=True).result


@pytest.mark.slow
def test_no_sync_only_saves_communication_when_it_wraps_the_forward(report):
    rows = {r["placement"]: r for r in report["no_sync"]}
    assert list(rows) == list(PLACEMENTS)
    assert rows["forward and backward"]["all_reduces_per_micro_step"] == [0, 0, 0, 1]
    assert rows["forward only"]["all_reduces_per_micro_step"] == [0, 0, 0, 1]
    assert rows["backward only"]["all_reduces_per_micro_step"] == [1, 1, 1, 1]
    assert rows["nowhere"]["all_reduces_per_micro_step"] == [1, 1, 1, 1]
    for r in rows.values():  # wasted bandwidth, not wrong gradients
        assert r["grad_matches_big_batch"] and r["max_difference"] < 1e-5


@pytest.mark.slow
def test_batch_norm_over_the_global_batch(report):
    bn = report["sync_batchnorm"]
    assert bn["sync_output_matches"] and bn["sync_input_grad_matches"]
    assert bn["sync_weight_grads_match"]
    assert not bn["per_rank_output_matches"] and bn["per_rank_max_difference"] > 0.1
    if report["backend"] == "gloo":
        assert bn["torch_sync_batchnorm"].startswith("refused: SyncBatchNorm expected input")
    else:
        assert bn["torch_sync_batchnorm"] == "matches"


@pytest.mark.slow
def test_our_trainer_matches_ddp(report):
    ddp, ours = report["trainer"]["ddp"], report["trainer"]["overlap"]
    assert len(ddp) == len(ours) == 4
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ddp), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_minimal_ddp_script_trains_like_one_process_on_the_whole_batch():
    """Notebook 09, section 2: the complete DDP script on 2 processes == 1 process."""
    import torch.nn.functional as F

    from course_lib.tasks import toy

    result = launch("course_lib.demos.ddp_minimal", nproc=2, timeout_s=240, quiet=True).result
    mlp = toy.make_mlp(hidden=32, norm="layer", seed=0)
    optimizer = torch.optim.SGD(mlp.parameters(), lr=0.1)
    x, y = toy.two_moons(256 * 20, seed=1)
    for step in range(20):
        optimizer.zero_grad(set_to_none=True)
        rows = slice(step * 256, (step + 1) * 256)
        F.cross_entropy(mlp(x[rows]), y[rows]).backward()
        optimizer.step()
    single = torch.cat([p.detach().reshape(-1) for p in mlp.parameters()])
    assert result["world_size"] == 2
    torch.testing.assert_close(torch.tensor(result["params"]), single, rtol=1e-5, atol=1e-5)
