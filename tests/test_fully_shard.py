"""ZeRO-2 (core/zero2.py), ZeRO-3 (core/fully_shard.py), prefetching (core/prefetch.py) and
bf16 gradient compression (core/compress.py) on 2, 3 and 4 processes with Gloo.

One launch of ``tests/workers/sharding_check.py`` per world size runs every multi-process check
and hands back the worst difference over the ranks; the tests here judge it. Tolerances: with 2
ranks a sum of two numbers is the same in any order and a division by 2 is exact, so ours and
torch's agree bit for bit; with 3 and 4 ranks the sums run in another order (our ring's, Gloo's
all-reduce's) and fp32 rounding differs by a few ulps (FP32), bf16 compute by a few bf16 ulps
(BF16). The small single-process tests at the end use a process group of one.
"""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.core.fully_shard import (
    MixedPrecisionPolicy,
    ShardedModule,
    full_state_dict,
    fully_shard,
)
from course_lib.runtime.launch import launch

WORKER = str(Path(__file__).parent / "workers" / "sharding_check.py")
FP32 = 1e-5  # losses of about 5 and parameters of about 1 after 3 steps: a few fp32 ulps
BF16 = 5e-3  # under one bf16 ulp at 1.0 (2^-7 = 0.0078)


_RUNS: dict[int, dict] = {}  # world size -> what the worker found: one launch each


def run_on(world_size: int) -> dict:
    if world_size not in _RUNS:
        result = launch(WORKER, nproc=world_size, timeout_s=240, quiet=True).result
        assert result is not None and result["world_size"] == world_size
        _RUNS[world_size] = result
    return _RUNS[world_size]


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def run(request) -> dict:
    return run_on(request.param)


def assert_close(found: dict, tolerance: float, world_size: int, what: str) -> None:
    """Bit for bit with 2 ranks; within ``tolerance`` otherwise."""
    assert found["same_names"], what
    if world_size == 2:
        assert found["bitwise"], (what, found)
    assert found["loss"] <= tolerance and found["param"] <= tolerance, (what, found)


@pytest.mark.slow
def test_fully_shard_trains_as_torchs_fully_shard(run):
    # SGD with momentum, AdamW, AdamW with param_dtype=bf16; a tied weight, a block used twice,
    # parameters of 1 value, one outside every block; 3 steps
    for case, found in run["vs_torch"].items():
        assert_close(found, BF16 if "bf16" in case else FP32, run["world_size"], case)


@pytest.mark.slow
def test_full_parameters_equal_an_unsharded_model_trained_alike(run):
    # one process on every rank's batch; also with the root unwrapped: its parameters are
    # replicated and finish_gradient_sync() averages their gradients
    assert set(run["vs_unsharded"]) == {"sgd", "adamw", "sgd root unwrapped"}
    for case, found in run["vs_unsharded"].items():
        assert found["same_names"], case
        assert found["loss"] <= FP32 and found["param"] <= FP32, (case, found)


@pytest.mark.slow
def test_prefetching_changes_no_bit(run):
    assert run["prefetch"]["bitwise"], run["prefetch"]  # the same collectives, earlier
    assert run["prefetch"]["same_bytes"]  # and no all-gather more: none prefetched in vain


@pytest.mark.slow
def test_zero2_trains_as_ddp_and_keeps_no_full_gradient(run):
    assert run["zero2"]["buckets"] > 1  # several buckets, reduce-scattered from hooks
    assert run["zero2"]["grads_freed"]  # after backward no parameter holds a .grad
    assert_close(run["zero2"], FP32, run["world_size"], "ZeRO-2 against DDP, AdamW")


@pytest.mark.slow
def test_bytes_each_rank_sends_per_step(run):
    sent = run["bytes"]  # one AdamW step; plain: the ring all-reduce of every gradient
    assert sent["zero2"] / sent["plain"] == pytest.approx(1.0, abs=0.01)  # RS + AG = AR
    assert sent["zero3"] / sent["plain"] == pytest.approx(1.5, abs=0.015)  # + an all-gather


@pytest.mark.slow
def test_bf16_compression_halves_the_bytes_at_a_small_error(run):
    found = run["compress"]
    assert found["hook_equals_torch"]  # our DDP hook, bit for bit torch's bf16_compress_hook
    assert found["bf16_bytes"] * 2 == found["fp32_bytes"]
    for error in (found["hook_error"], found["wrapper_error"]):  # relative to the largest
        assert 0 < error < 2 ** -6  # lossy, but within a few bf16 roundings (2^-8 each)
    assert found["wrapper_vs_ddp"] <= 1e-7  # the fp32 baseline: our wrapper is DDP


TABLE = {  # bytes per parameter per rank with fp32 AdamW: (parameters, gradients, state)
    "zero2": lambda n: (4, 4 / n, 8 / n),
    "zero3": lambda n: (4 / n, 4 / n, 8 / n),
}


@pytest.mark.slow
def test_memory_per_rank_follows_the_zero_table():
    run = run_on(4)  # its groups of 1, 2 and 4 processes
    for size, stages in run["memory"].items():
        n = int(size)
        for stage, expected in TABLE.items():
            found = stages[stage]
            slack = 16 * n * found["pieces"]  # < n values of padding per shard or bucket
            for key, per_param in zip(("params", "grads", "state"), expected(n), strict=True):
                assert abs(found[key] - per_param * found["numel"]) <= slack, (size, stage, key)
            assert found["after_step_whole"] == 0  # ZeRO-3: no module whole after the step
        mixed = stages["zero3 bf16"]  # 2 + 2 + 12 bytes, all of it sharded: 16 / n in all
        total = mixed["params"] + mixed["grads"] + mixed["state"]
        assert abs(total - 16 / n * mixed["numel"]) <= 16 * n * mixed["pieces"]
        # while a block computes, only it and the root are whole, in bf16: 2 bytes a value
        root, block = mixed["units"][0], max(mixed["units"][1:])
        assert mixed["most_whole_in_forward"] == 2 * n * (root + block)


class Tiny(nn.Module):
    """Two wrapped blocks and a root-level layer. Small for test speed."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def wrapped(**kwargs) -> Tiny:
    model = Tiny()
    for block in model.blocks:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def whole_bytes(model: nn.Module) -> int:
    return sum(m.shard_state.full.untyped_storage().nbytes() for m in model.modules()
               if hasattr(m, "shard_state"))


def test_one_rank_is_the_plain_model_bit_for_bit(one_process_group):
    plain, sharded = Tiny(), wrapped()
    assert all(name.endswith("flat_shard") for name, _ in sharded.named_parameters())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (plain, sharded)]
    for step in range(2):
        for model, opt in zip((plain, sharded), optimizers, strict=True):
            for micro in range(2):  # gradient accumulation: shard.grad adds up
                x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2 * step + micro))
                F.mse_loss(model(x), torch.zeros(3, 2)).backward()
            opt.step()
            opt.zero_grad()
    full = full_state_dict(sharded)
    assert sorted(full) == sorted(n for n, _ in plain.named_parameters())  # before wrapping
    for name, param in plain.named_parameters():
        assert torch.equal(full[name], param), name


def test_parameters_are_whole_only_while_their_module_computes(one_process_group):
    model, seen = wrapped(), []
    model.blocks[1].register_forward_pre_hook(lambda *_: seen.append(whole_bytes(model)))
    loss = model(torch.randn(3, 4)).sum()
    assert seen == [4 * (10 + 20)]  # the root (head: 10 values) and block 1 (20), fp32
    assert whole_bytes(model) == 0  # every module freed after its forward
    loss.backward()
    assert whole_bytes(model) == 0  # gathered again for backward, freed after it
    for module in (model, *model.blocks):
        state = module.shard_state
        assert state.full.grad is None and state.shard.grad.shape == state.shard.shape


def test_bf16_computes_in_bf16_and_keeps_fp32_shards(one_process_group):
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    model = wrapped(mp_policy=policy)
    out = model(torch.randn(3, 4))  # an fp32 input, cast to bf16 by the root's hook
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters())


def test_keeping_the_root_whole_after_forward(one_process_group):
    model = Tiny()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model, reshard_after_forward=False)  # FSDP2's choice for the root
    loss = model(torch.randn(3, 4)).sum()
    assert whole_bytes(model) == 4 * 10  # the root's head, waiting for backward
    loss.backward()
    assert whole_bytes(model) == 0


def test_wrapping_twice_and_mixed_dtypes_are_refused(one_process_group):
    model = wrapped()
    with pytest.raises(ValueError, match="wrapped already"):
        fully_shard(model)
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one dtype, device and requires_grad"):
        fully_shard(mixed)


def test_the_module_becomes_a_sharded_subclass_with_fsdp2s_methods(one_process_group):
    model = wrapped()
    block = model.blocks[0]
    assert isinstance(block, ShardedModule) and isinstance(block, nn.Linear)
    assert type(block).__name__ == "ShardedLinear" and type(model).__name__ == "ShardedTiny"
    assert type(model.blocks[1]) is type(block)  # one class per wrapped class
    for method in ("unshard", "reshard", "set_requires_gradient_sync", "finish_gradient_sync",
                   "full_state_dict"):
        assert method not in vars(block) and callable(getattr(block, method)), method
    sliced = fully_shard(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))[:1]
    assert type(sliced) is nn.Sequential  # a new module of a sharded class: the plain one
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(model)


def test_unshard_and_reshard_are_the_modules_own(one_process_group):
    plain, model = Tiny(), wrapped()
    block = model.blocks[0]
    block.unshard()
    assert whole_bytes(model) == 4 * 20  # this block's values, not its parent's
    assert torch.equal(block.weight, plain.blocks[0].weight)  # its view of the gathered vector
    block.reshard()
    assert whole_bytes(model) == 0
    handle = block.unshard(async_op=True)  # returns at once; the next forward waits for it
    handle.wait()
    assert torch.equal(block.bias, plain.blocks[0].bias)
    torch.testing.assert_close(model(torch.ones(1, 4)), plain(torch.ones(1, 4)))


def test_accumulating_without_gradient_sync_matches_the_plain_model(one_process_group):
    plain, model = Tiny(), wrapped()
    xs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    for x in xs:
        plain(x).square().mean().backward()
    model.set_requires_gradient_sync(False)
    model(xs[0]).square().mean().backward()
    states = [m.shard_state for m in (model, *model.blocks)]
    assert all(s.shard.grad is None and s.full.grad is not None for s in states)  # kept whole
    assert whole_bytes(model) == 0  # the parameters are freed all the same
    with pytest.raises(RuntimeError, match="set_requires_gradient_sync\\(True\\) before the last"):
        model.finish_gradient_sync()
    model.set_requires_gradient_sync(True)
    model(xs[1]).square().mean().backward()
    model.finish_gradient_sync()
    assert all(s.full.grad is None for s in states)
    full = {name: param.grad for name, param in plain.named_parameters()}
    for module, prefix in ((model.blocks[0], "blocks.0."), (model.blocks[1], "blocks.1."),
                           (model, "")):
        state = module.shard_state
        pieces = state.shard.grad.split([*state.numels, state.padding])[:-1]
        for (_, where), piece in zip(state.places, pieces, strict=True):
            name = prefix + where[0][2]
            torch.testing.assert_close(piece.view_as(full[name]), full[name], rtol=0, atol=0)


def test_recurse_false_leaves_the_modules_below_syncing(one_process_group):
    model = wrapped()
    model.set_requires_gradient_sync(False, recurse=False)
    assert not model.shard_state.requires_gradient_sync
    assert all(b.shard_state.requires_gradient_sync for b in model.blocks)
