"""ZeRO-2 (course_lib.core.zero2) and the bf16 all-reduce (course_lib.core.compress) in one
process, on a process group of one: what does not need several ranks. Against torch DDP on 2, 3
and 4 processes, with the bytes and the memory per rank: tests/test_fully_shard.py, which
shares one launch per world size with ZeRO-3."""

import pytest
import torch
from torch import nn

from course_lib.core.compress import bf16_all_reduce
from course_lib.core.messages import ByteCounter
from course_lib.core.zero2 import Zero2

SMALL_MB = 0.0002  # about 200 bytes: a bucket per layer or two


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Linear(3, 2))


def batch(step: int) -> torch.Tensor:
    return torch.randn(4, 5, generator=torch.Generator().manual_seed(step))


def test_one_rank_is_plain_adamw_bit_for_bit_and_no_full_gradient_stays(one_process_group):
    plain, sharded = small_model(), small_model()
    opt = torch.optim.AdamW(plain.parameters(), lr=0.01, weight_decay=0.1)
    zero = Zero2(sharded.parameters(), torch.optim.AdamW, process_group=one_process_group,
                 bucket_cap_mb=SMALL_MB, lr=0.01, weight_decay=0.1)
    assert len(zero.buckets) > 1
    for step in range(3):
        for model in (plain, sharded):
            model(batch(step)).square().mean().backward()
        assert all(p.grad is None for p in sharded.parameters())  # freed by the hooks
        zero.finish_gradient_sync()
        opt.step()
        zero.step()
        opt.zero_grad()
        zero.zero_grad()
    for a, b in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.equal(a, b)


def test_gradient_accumulation_adds_up_in_the_shard(one_process_group):
    plain, sharded = small_model(), small_model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    zero = Zero2(sharded.parameters(), torch.optim.SGD, process_group=one_process_group,
                 bucket_cap_mb=SMALL_MB, lr=0.1)
    for micro in range(2):  # two backward, one step; step() finishes the sync itself
        for model in (plain, sharded):
            (model(batch(micro)).square().mean() / 2).backward()
    opt.step()
    zero.step()
    for a, b in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_unused_parameter_counts_as_zero_gradient(one_process_group):
    model = small_model()
    last = model[3].weight.detach().clone()
    zero = Zero2(model.parameters(), torch.optim.SGD, process_group=one_process_group,
                 bucket_cap_mb=SMALL_MB, lr=0.1)
    model[:3](batch(0)).sum().backward()  # model[3] unused: its hooks never fire
    zero.step()  # finish_gradient_sync reduces its bucket, with zeros for it
    assert torch.equal(model[3].weight, last)
    assert not torch.equal(model[0].weight, small_model()[0].weight)  # the others moved


def test_param_groups_reach_the_inner_optimizer_and_a_scheduler_works(one_process_group):
    model = small_model()
    zero = Zero2([{"params": model[0].parameters(), "lr": 0.1},
                  {"params": model[2:].parameters()}], torch.optim.SGD,
                 process_group=one_process_group, lr=0.01)
    assert len(zero.inner.param_groups) == 2  # a bucket never mixes groups
    scheduler = torch.optim.lr_scheduler.StepLR(zero, step_size=1, gamma=0.5)
    model(batch(0)).sum().backward()
    zero.step()
    scheduler.step()
    model(batch(1)).sum().backward()
    zero.step()
    assert [g["lr"] for g in zero.inner.param_groups] == [0.05, 0.005]  # copied at the step
    assert zero.state_dict()["param_groups"][0]["lr"] == 0.05  # this rank's inner state


def test_bf16_all_reduce_rounds_the_message_and_counts_half_the_bytes(one_process_group):
    values = torch.randn(1000)
    tensor, counter = values.clone(), ByteCounter()
    handle = bf16_all_reduce(tensor, one_process_group, async_op=True, counter=counter)
    handle.wait()
    assert tensor.dtype == torch.float32  # stays fp32; only the message was bf16
    assert torch.equal(tensor, values.bfloat16().float())  # one rank: the rounding alone
    assert counter.bytes_sent == 1000 * 2
    relative = ((tensor - values).abs() / values.abs()).max().item()
    assert 0 < relative <= 2 ** -8  # bf16 keeps 8 significant bits: rounding errs by 2^-8
    assert bf16_all_reduce(values, one_process_group) is None  # as dist.all_reduce


def test_a_frozen_layer_is_left_alone_and_a_later_change_refused(one_process_group):
    plain, sharded = small_model(), small_model()
    for model in (plain, sharded):
        model[0].requires_grad_(False)  # frozen before Zero2 is built: no bucket, no hook
    opt = torch.optim.AdamW(plain.parameters(), lr=0.01, weight_decay=0.1)
    zero = Zero2(sharded.parameters(), torch.optim.AdamW, process_group=one_process_group,
                 bucket_cap_mb=SMALL_MB, lr=0.01, weight_decay=0.1)
    for model, optimizer in ((plain, opt), (sharded, zero)):
        model(batch(0)).square().mean().backward()
        optimizer.step()
    for a, b in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="cannot take a parameter group once built"):
        zero.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
    sharded[0].weight.requires_grad_(True)
    sharded(batch(1)).square().mean().backward()
    with pytest.raises(RuntimeError, match="parameter 0 \\(shape \\(7, 5\\)\\) changed after "
                                           "Zero2 was built; it is now trained"):
        zero.step()
