"""Our data-parallel wrappers and ZeRO-1 (course_lib/core) against torch DDP and one process.

One launch of ``tests/workers/data_parallel_check.py`` per world size (1 to 4) trains every
wrapper with a loop that calls ``loss.backward()`` itself, on a model with a tied weight, a
frozen layer, a layer nobody uses and a branch only rank 0 uses; the tests here judge what it
hands back. The pure pieces (bucket plans, errors, keywords, what a sync sends) are tested in
this process.
"""

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course_lib.core.buckets import MB, BucketedDataParallel, make_buckets, plan_buckets
from course_lib.core.collectives import ring_all_reduce
from course_lib.core.data_parallel import AllReducePerParameter
from course_lib.core.outputs import tensors_in, unseen_objects
from course_lib.core.overlap import OverlapDataParallel
from course_lib.lessons.timeline import overlap_summary
from course_lib.runtime.launch import launch

WORKER = str(Path(__file__).parent / "workers" / "data_parallel_check.py")
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7  # gradients: float32 rounding, nothing more
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-5  # parameters after a few steps
FIND_UNUSED = {"allreduce", "bucketed one bucket", "overlap find_unused"}  # as in the worker
WRAPPERS = [AllReducePerParameter, BucketedDataParallel, OverlapDataParallel]


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def run(request) -> dict:
    result = launch(WORKER, nproc=request.param, timeout_s=240, quiet=True).result
    assert result is not None and result["world_size"] == request.param
    return result


def tensors(values: dict) -> dict:
    return {n: None if v is None else torch.tensor(v) for n, v in values.items()}


def assert_same(ours: dict, theirs: dict, rtol: float, atol: float, what: str) -> None:
    ours, theirs = tensors(ours), tensors(theirs)
    assert ours.keys() == theirs.keys(), what
    for name, want in theirs.items():
        if want is None:
            continue
        torch.testing.assert_close(ours[name], want, rtol=rtol, atol=atol,
                                   msg=lambda m, n=name: f"{what}, {n}: {m}")


@pytest.mark.slow
def test_every_wrapper_trains_like_ddp_and_like_one_process(run):
    for label, v in run["variants"].items():
        assert_same(v["params"], run["ddp"]["params"], PARAM_RTOL, PARAM_ATOL, f"{label} vs DDP")
        assert_same(v["params"], run["reference"]["params"], PARAM_RTOL, PARAM_ATOL,
                    f"{label} vs one process")
        assert_same(v["grads"], run["ddp"]["grads"], GRAD_RTOL, GRAD_ATOL, f"{label} grads")
    assert_same(run["ddp"]["params"], run["reference"]["params"], PARAM_RTOL, PARAM_ATOL, "DDP")


@pytest.mark.slow
def test_a_parameter_no_rank_uses_keeps_no_gradient_like_ddp(run):
    assert run["ddp"]["grads"]["unused.weight"] is None  # the check can tell None apart
    for label, v in run["variants"].items():
        grad = v["grads"]["unused.weight"]
        if label in FIND_UNUSED:
            assert grad is None, label  # as DDP with find_unused_parameters=True
        else:
            assert grad is not None and not any(grad), label  # counted as zeros
        assert v["grads"]["frozen.weight"] is None, label  # requires_grad=False: left out


@pytest.mark.slow
def test_the_tied_weight_and_the_rank_0_branch_get_the_mean_gradient(run):
    reference = tensors(run["reference"]["grads"])
    assert "proj_out.weight" not in reference  # one parameter, listed once
    for label, v in run["variants"].items():
        for name in ("proj_in.weight", "extra.weight"):
            torch.testing.assert_close(torch.tensor(v["grads"][name]), reference[name],
                                       rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=f"{label} {name}")


@pytest.mark.slow
def test_replicas_stay_bitwise_equal_and_no_sync_sends_nothing(run):
    for label, v in [*run["variants"].items(), ("ddp", run["ddp"])]:
        assert all(v["equal_after_step"]) and len(v["equal_after_step"]) == 3, label
        assert v["calls_inside_no_sync"] == 0, label


@pytest.mark.slow
def test_all_reduces_per_step_follow_the_buckets(run):
    trained = [n for n, g in run["reference"]["grads"].items() if g is not None]
    steps = len(run["ddp"]["equal_after_step"])
    for label, v in run["variants"].items():
        if not v["buckets"]:  # one all-reduce per parameter that needs a gradient; the
            unused = 0 if label in FIND_UNUSED else 2  # unused layer's two only without the
            assert v["all_reduces"] == steps * (len(trained) + unused), label  # search
            continue
        names = [n for bucket in v["buckets"] for n in bucket]
        assert sorted(names) == sorted([*trained, "unused.weight", "unused.bias"]), label
        assert v["all_reduces"] == steps * len(v["buckets"]), label
    assert len(run["variants"]["bucketed one bucket"]["buckets"]) == 1
    per_parameter = run["variants"]["bucketed one per parameter"]["buckets"]
    assert all(len(bucket) == 1 for bucket in per_parameter)


@pytest.mark.slow
def test_the_training_step_gives_ddps_gradient_on_variable_length_data(run):
    t = run["transformer"]
    ddp = torch.tensor(t["ddp"]["grad"])
    for name, v in t.items():
        assert v["equal_on_ranks"], name
        assert v["loss"] == pytest.approx(t["ddp"]["loss"], rel=1e-6), name
        ours = torch.tensor(v["grad"])
        torch.testing.assert_close(ours, ddp, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
        assert float((ours - ddp).norm() / ddp.norm()) <= 1e-6, name


@pytest.mark.slow
def test_overlap_starts_sending_before_backward_ends(run):
    for name, events in run["timelines"].items():
        backward = [e for e in events if e["kind"] == "compute"]
        comm = [e for e in events if e["kind"] == "comm"]
        assert len(backward) == 1 and comm and all(e["end_s"] >= e["start_s"] for e in events)
        first = min(e["start_s"] for e in comm)
        if name == "overlap" and run["world_size"] > 1:
            assert first < backward[0]["end_s"], "the first bucket waited for backward"
            assert overlap_summary(events)["hidden_s"] > 0
        elif name != "overlap":
            assert first >= backward[0]["end_s"], f"{name} must wait for backward"


@pytest.mark.slow
def test_zero1_equals_plain_data_parallelism_with_1_over_n_of_the_state(run):
    plain, zero = run["zero"]["plain"], run["zero"]["zero"]
    assert_same(zero["params"], plain["params"], PARAM_RTOL, PARAM_ATOL, "ZeRO-1 vs DDP")
    assert zero["equal_on_ranks"] and plain["equal_on_ranks"]
    unused_after = torch.tensor(zero["params"]["unused.weight"])  # no gradient anywhere:
    unused_before = torch.tensor(run["reference"]["params"]["unused.weight"])  # ...left alone
    torch.testing.assert_close(unused_after, unused_before, rtol=0, atol=0)
    n, per_rank = run["world_size"], zero["state_bytes_per_rank"]
    numel = sum(len(v) for v in plain["params"].values())  # every parameter, frozen ones too
    pieces = len(plain["params"])  # at most one piece of each parameter per rank
    # AdamW keeps 2 float32 moments per value and a 4-byte step count per (piece of a) tensor
    assert max(per_rank) <= 8 * -(-numel // n) + 4 * pieces  # my chunk's moments: 1/N
    assert sum(per_rank) >= 8 * (plain["state_bytes"] // 8)  # every trained value, once
    if n > 1:
        assert max(per_rank) < plain["state_bytes"]


@pytest.mark.slow
def test_find_unused_parameters_walks_a_nested_dict_output_like_ddp(run):
    results = run["dict_output"]
    ddp = results.pop("ddp")
    assert ddp["grads"]["unused.weight"] is None and ddp["grads"]["aux.weight"] is not None
    for name, ours in results.items():
        assert [n for n, g in ours["grads"].items() if g is None] == ["unused.weight",
                                                                      "unused.bias"], name
        assert_same(ours["grads"], ddp["grads"], GRAD_RTOL, GRAD_ATOL, f"{name} grads")
        assert_same(ours["params"], ddp["params"], PARAM_RTOL, PARAM_ATOL, f"{name} params")


@pytest.mark.slow
def test_zero1_step_calls_two_small_all_reduces_beside_the_ring(run):
    zero, n = run["zero"]["zero"], run["world_size"]
    tensors = len(run["zero"]["plain"]["params"])  # Zero1 holds every parameter, frozen too
    steps = zero["steps"]
    assert zero["all_reduces"] == [["all_reduce", "int32", tensors],  # who has a gradient
                                   ["all_reduce", "float64", 1]] * steps  # the squared norm
    ring_messages = 2 * (n - 1) * steps  # reduce-scatter and all-gather: N-1 steps each
    assert zero["calls"] == {"all_reduce": 2 * steps,
                             **({"batch_isend_irecv": ring_messages} if n > 1 else {})}
    numel = sum(len(v) for v in run["zero"]["plain"]["params"].values())
    for rank, sent in enumerate(zero["ring_bytes_per_rank"]):  # one ring all-reduce's bytes
        sizes = [len(c) for c in torch.tensor_split(torch.arange(numel), n)]
        expected = 0 if n == 1 else (2 * numel - sizes[rank] - sizes[(rank + 1) % n]) * 4
        assert sent == expected * steps, rank


@pytest.mark.slow
def test_ranks_that_wrap_different_models_all_get_a_clear_error(run):
    n = run["world_size"]
    if n == 1:
        assert "different_models" not in run
        return
    for rank, message in enumerate(run["different_models"]):
        assert "tensor 0: rank 0 has shape (3, 2)" in message, (rank, message)
        assert f"rank {n - 1} has shape (2, 3)" in message, (rank, message)
        assert "Every rank must wrap the same model" in message, (rank, message)


# ---- in this process -------------------------------------------------------------------------


def test_plan_buckets_fills_greedily_and_splits_on_dtype():
    assert plan_buckets([100, 200, 300, 50], ["f"] * 4, 300) == [[0, 1], [2], [3]]
    assert plan_buckets([500, 10, 10], ["f"] * 3, 300) == [[0], [1, 2]]  # too big: alone
    assert plan_buckets([10, 10, 10], ["f", "h", "h"], 300) == [[0], [1, 2]]
    assert plan_buckets([], [], 300) == []
    with pytest.raises(ValueError, match="bucket_cap_mb > 0"):
        plan_buckets([10], ["f"], 0)


def test_make_buckets_gives_each_parameter_a_slot_of_its_shape():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = list(model.parameters())[::-1]  # last layer first
    buckets = make_buckets(params, bucket_cap_mb=40 / MB)
    assert [p for b in buckets for p in b.params] == params
    for b in buckets:
        assert b.buffer.numel() == sum(p.numel() for p in b.params)
        for p in b.params:
            assert b.slot(p).shape == p.shape
            assert b.slot(p).data_ptr() >= b.buffer.data_ptr()  # a view into the buffer
    assert len(make_buckets(params, None)) == 1
    assert len(make_buckets(params, 1e-9)) == len(params)


def test_a_bucket_finds_a_slot_without_scanning_its_parameters():
    params = list(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).parameters())[::-1]
    bucket = make_buckets(params, None)[0]
    slots = list(bucket.slots)
    bucket.params = ()  # a lookup that rebuilt a list from the parameters would find nothing
    assert all(bucket.slot(p) is slot for p, slot in zip(params, slots, strict=True))


NOT_SYNCED = ("finish_gradient_sync() without a forward outside no_sync() since the last sync: "
              "run the last micro-step's forward and backward outside no_sync()")


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_finishing_without_a_synced_forward_says_what_to_do(one_process_group, wrapper):
    model = wrapper(nn.Linear(3, 2), one_process_group)
    with pytest.raises(RuntimeError) as nothing_ran:
        model.finish_gradient_sync()
    with model.no_sync():
        model(torch.randn(4, 3)).sum().backward()
    with pytest.raises(RuntimeError) as only_no_sync:
        model.finish_gradient_sync()
    assert str(nothing_ran.value) == str(only_no_sync.value) == NOT_SYNCED  # one message
    model(torch.randn(4, 3)).sum().backward()
    model.finish_gradient_sync()  # now it works; one rank: the gradients stay as they are
    assert all(p.grad is not None for p in model.parameters())


def test_overlap_inherits_no_method_it_never_uses():
    assert not hasattr(OverlapDataParallel, "grads_to_sync")  # the per-parameter list
    assert OverlapDataParallel.finish_gradient_sync is not BucketedDataParallel.finish_gradient_sync


def test_the_wrappers_take_ddps_keywords_and_one_default_all_reduce(one_process_group):
    ddp_keywords = set(inspect.signature(DistributedDataParallel).parameters)
    for wrapper in WRAPPERS:
        keywords = inspect.signature(wrapper).parameters
        assert set(keywords) - {"all_reduce"} <= ddp_keywords, wrapper.__name__
        assert keywords["all_reduce"].default is dist.all_reduce, wrapper.__name__
        assert "dist.all_reduce``, the default of all three wrappers" in wrapper.__doc__
    options = {"process_group": one_process_group, "find_unused_parameters": True}
    for wrapper in WRAPPERS:  # DDP's keywords move over unchanged (the worker builds DDP too)
        model = wrapper(nn.Linear(3, 2), **options, **({} if wrapper is AllReducePerParameter
                                                         else {"bucket_cap_mb": 25}))
        assert model.process_group is one_process_group and model.find_unused_parameters


@pytest.fixture
def collective_calls(monkeypatch) -> list[str]:
    """The names of torch.distributed's collectives called while the test runs."""
    calls = []

    def counted(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast"):
        monkeypatch.setattr(dist, name, counted(name, getattr(dist, name)))
    return calls


def test_a_wrapper_checks_shapes_once_when_built_not_at_each_sync(one_process_group,
                                                                  collective_calls):
    module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model = AllReducePerParameter(module, one_process_group, all_reduce=ring_all_reduce)
    assert collective_calls == ["all_gather"] + ["broadcast"] * 4  # the check, rank 0's weights
    collective_calls.clear()
    for _ in range(2):
        model(torch.randn(5, 3)).sum().backward()
        model.finish_gradient_sync()
    assert collective_calls == []  # the ring on one rank sends nothing, and checks nothing


def test_tensors_are_found_in_nested_outputs_as_ddp_finds_them():
    from dataclasses import dataclass

    @dataclass
    class Output:
        loss: torch.Tensor
        extra: dict

    a, b, c, d = (torch.zeros(i + 1) for i in range(4))
    nested = {"x": a, "y": (b, [c, "text", None]), "z": Output(d, {"skip": 3})}
    assert [t.numel() for t in tensors_in(nested)] == [1, 2, 3, 4]
    assert tensors_in("text") == [] and tensors_in(a) == [a]


def test_the_search_names_what_it_cannot_look_into():
    class Cache:
        pass

    a = torch.zeros(1)
    assert unseen_objects({"x": a, "n": 3, "s": "text", "none": None}) == []
    assert unseen_objects((a, [Cache()])) == ["Cache"]
    assert tensors_in(torch.Size([2, 3])) == []  # a shape is a tuple of ints, not a tensor


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_parameter_replaced_added_or_unfrozen_after_wrapping_is_refused(one_process_group,
                                                                          wrapper):
    changes = {"replaced": lambda m: setattr(m, "0", nn.Linear(3, 4)),
               "new": lambda m: m.append(nn.Linear(2, 2)),
               "unfrozen": lambda m: m[1].weight.requires_grad_(True)}
    says = {"replaced": "parameter '0.weight' was replaced", "new": "parameter '2.weight' is new",
            "unfrozen": "parameter '1.weight' was unfrozen"}
    for change, make in changes.items():
        module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        module[1].weight.requires_grad_(False)
        model = wrapper(module, one_process_group)
        make(module)
        with pytest.raises(RuntimeError, match="changed after it was wrapped") as refused:
            model(torch.randn(2, 3))
        assert says[change] in str(refused.value), change
