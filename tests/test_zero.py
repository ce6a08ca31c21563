"""ZeRO-1 (course_lib.core.zero): equal to plain data parallelism, 1/N of the optimizer state per
rank, one all-reduce's bytes round the ring plus two small all-reduces; the optimizer's contract
(a closure, parameter groups, the keywords of torch's ZeroRedundancyOptimizer). One 4-process run
covers group sizes 1, 2, 3 and 4; tests/test_data_parallel.py counts the calls on 1 to 4 ranks."""

import pytest
import torch
import torch.distributed as dist

from course_lib.core.collectives import chunk_bounds
from course_lib.core.zero import Zero1, flatten_into_views
from course_lib.lessons.memory import optimizer_state_bytes
from course_lib.runtime.launch import launch
from course_lib.tasks.models import count_parameters, make_transformer


def test_parameters_become_views_of_one_flat_buffer():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # small
    before = [p.detach().clone() for p in model.parameters()]
    flat = flatten_into_views(list(model.parameters()))
    assert flat.numel() == sum(p.numel() for p in before)
    for p, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, old)
    flat.zero_()  # writing the buffer writes the parameters
    assert all(bool((p == 0).all()) for p in model.parameters())


def test_mixed_dtypes_are_refused_with_what_to_do():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2).double())]
    with pytest.raises(ValueError, match="one dtype and device"):
        flatten_into_views(params)


def test_state_bytes_counts_adam_moments_and_steps():
    p = torch.nn.Parameter(torch.zeros(10))
    opt = torch.optim.AdamW([p])
    assert optimizer_state_bytes(opt) == 0  # AdamW makes its state at the first step
    p.grad = torch.ones(10)
    opt.step()
    assert optimizer_state_bytes(opt) == 10 * 4 * 2 + 4  # exp_avg, exp_avg_sq and a step


def test_one_rank_is_plain_adamw_bit_for_bit(one_process_group):
    plain, sharded = make_transformer(seed=0), make_transformer(seed=0)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    zero = Zero1(sharded.parameters(), torch.optim.AdamW, one_process_group, lr=1e-2)
    x = torch.randint(0, 10, (4, 8))  # small for test speed
    for _ in range(3):
        plain(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sharded(x).square().mean().backward()
        zero.step()
        zero.zero_grad()
    for a, b in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.equal(a, b)
    assert (zero.start, zero.end) == (0, count_parameters(plain))


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def test_step_runs_a_closure_that_calls_backward_as_torch_optimizers_do(one_process_group):
    plain, sharded = small_model(), small_model()
    x = torch.randn(5, 3)
    opt = torch.optim.AdamW(plain.parameters(), lr=0.1)
    zero = Zero1(sharded.parameters(), torch.optim.AdamW, process_group=one_process_group,
                 lr=0.1)
    for model, optimizer in ((plain, opt), (sharded, zero)):
        def closure(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss

        with torch.no_grad():  # step() must turn gradients on for the closure itself
            losses = [float(optimizer.step(closure)) for _ in range(2)]
        assert losses[1] < losses[0]
    for a, b in zip(plain.parameters(), sharded.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_group_added_after_building_is_refused_and_the_step_still_works(one_process_group):
    model = small_model()
    zero = Zero1(model.parameters(), torch.optim.SGD, one_process_group, lr=0.1)
    with pytest.raises(RuntimeError, match=r"Pass every group to Zero1\(\.\.\.\) when you "):
        zero.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert len(zero.param_groups) == 1
    model(torch.randn(5, 3)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    zero.step()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_a_model_converted_after_building_is_refused_not_left_unchanged(one_process_group):
    model = small_model()
    zero = Zero1(model.parameters(), torch.optim.SGD, one_process_group, lr=0.1)
    model.to(torch.float32)  # the dtype it has: nothing moves, the step works
    model(torch.randn(5, 3)).sum().backward()
    zero.step()
    model.double()  # new memory for every parameter: Zero1's flat vector no longer holds them
    model(torch.randn(5, 3, dtype=torch.float64)).sum().backward()
    with pytest.raises(RuntimeError, match="Convert or move the model first, then build Zero1"):
        zero.step()


def test_zero1_takes_torchs_process_group_keyword_and_refuses_unknown_ones(one_process_group):
    zero = Zero1(small_model().parameters(), torch.optim.SGD, process_group=one_process_group,
                 lr=0.1)
    assert zero.process_group is one_process_group
    with pytest.raises(TypeError, match="group"):  # torch's name is process_group=
        Zero1(small_model().parameters(), torch.optim.SGD, group=one_process_group, lr=0.1)


def test_zero1_step_makes_two_small_all_reduces_and_no_other_collective(one_process_group,
                                                                       monkeypatch):
    calls = []

    def counted(name, real):
        def call(tensor, *args, **kwargs):
            calls.append((name, tensor.dtype, tensor.numel()))
            return real(tensor, *args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "send", "recv",
                 "batch_isend_irecv"):
        monkeypatch.setattr(dist, name, counted(name, getattr(dist, name)))
    model = small_model()
    zero = Zero1(model.parameters(), torch.optim.SGD, one_process_group, lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    zero.step()  # one rank: the ring sends nothing; the two small all-reduces remain
    assert calls == [("all_reduce", torch.int32, 4),  # per parameter tensor: has a gradient?
                     ("all_reduce", torch.float64, 1)]  # the squared norm, for clipping


def test_param_groups_reach_the_inner_optimizer_and_a_scheduler_works(one_process_group):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # small
    zero = Zero1([{"params": model[0].parameters(), "lr": 0.1},
                  {"params": model[1].parameters()}], torch.optim.SGD, one_process_group,
                 lr=0.01)
    assert [g["lr"] for g in zero.param_groups] == [0.1, 0.01]
    scheduler = torch.optim.lr_scheduler.StepLR(zero, step_size=1, gamma=0.5)
    model(torch.randn(5, 3)).sum().backward()
    zero.step()
    scheduler.step()
    assert [g["lr"] for g in zero.param_groups] == [0.05, 0.005]
    model(torch.randn(5, 3)).sum().backward()
    zero.step()
    assert [g["lr"] for g in zero.inner.param_groups] == [0.05, 0.005]  # copied at the step
    saved = zero.state_dict()
    assert saved["owned"] == (0, sum(p.numel() for p in model.parameters()))
    zero.load_state_dict(saved)
    with pytest.raises(ValueError, match="load each rank's own file"):
        zero.load_state_dict({**saved, "owned": (0, 3)})


@pytest.fixture(scope="module")
def run():
    return launch("course_lib.demos.zero_demo", nproc=4, args=["--sizes", "1,2,3,4"],
                  timeout_s=240, quiet=True)


@pytest.mark.slow
def test_zero1_matches_plain_data_parallelism(run):
    assert sorted(run.result["by_size"]) == ["1", "2", "3", "4"]
    for size, ranks in run.result["by_size"].items():
        assert [r["rank"] for r in ranks] == list(range(int(size)))
        for r in ranks:
            assert r["params_close"], (size, r["rank"], r["max_difference"])
            assert r["max_difference"] < 1e-5


@pytest.mark.slow
def test_each_rank_keeps_only_its_chunk_of_the_optimizer_state(run):
    numel = count_parameters(make_transformer(seed=0))
    tensors = len(list(make_transformer(seed=0).parameters()))
    for size, ranks in run.result["by_size"].items():
        bounds = chunk_bounds(numel, int(size))
        for r in ranks:
            start, end = bounds[r["rank"]]
            assert r["owned"] == [start, end]
            # 2 fp32 moments per value I own, a 4-byte step count per piece of a parameter
            assert r["zero_state_bytes"] == (end - start) * 8 + 4 * r["pieces"]
            assert r["plain_state_bytes"] == numel * 8 + tensors * 4  # every rank, all of it
        assert sum(r["zero_state_bytes"] - 4 * r["pieces"] for r in ranks) == numel * 8
    one = run.result["by_size"]["1"][0]["zero_state_bytes"]
    four = max(r["zero_state_bytes"] for r in run.result["by_size"]["4"])
    assert four <= one / 4 + 8 + 4 * tensors  # a quarter, give or take rounding and steps


@pytest.mark.slow
def test_zero1_ring_sends_exactly_one_all_reduces_bytes(run):
    """The reduce-scatter and all-gather; the two small all-reduces beside them are counted by
    the test above and, on 1 to 4 ranks, by tests/test_data_parallel.py."""
    numel = count_parameters(make_transformer(seed=0))
    for size, ranks in run.result["by_size"].items():
        n = int(size)
        for r in ranks:
            assert r["zero_bytes_sent_per_step"] == r["ring_all_reduce_bytes"]
            expected = 2 * (n - 1) * numel * 4 / n  # the ring's 2(N-1)/N law
            assert abs(r["zero_bytes_sent_per_step"] - expected) <= 2 * (n - 1) * 4
