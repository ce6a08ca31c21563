"""Checkers for the exercises of notebook 10b (sharding everything: ZeRO-2 and ZeRO-3)."""

from __future__ import annotations

import math

import torch

from course_lib.check.cases import shard_unit_cases, zero2_cases
from course_lib.check.checker import exercise, expect
from course_lib.check.mp.harness import WORLD_SIZES, check_file
from course_lib.check.mp.learner import find_learner_file
from course_lib.check.mp.tracer import ALL_REDUCES
from course_lib.check.mp.verdict import Advice
from course_lib.runtime.workspace import record_pass

# ---- a DDP communication hook in bf16: the learner's file, on 2, 3 and 4 processes ------

MY_BF16_HOOK_FILE = "workspace/my_bf16_hook.py"
BF16_HOOK_CASES = "course_lib.check.cases.bf16_hook_cases"
BF16_HOOK_ADVICE = Advice.unpaired("every rank must all-reduce each bucket once, in the process "
                                   "group DDP hands the hook", calls="collectives")
UNIT_ROUNDOFF = 2.0 ** -8  # bf16 keeps 8 significant bits: each rounding is within 2^-8


def bf16_close(got: torch.Tensor, want: torch.Tensor, size: torch.Tensor, n: int) -> bool:
    """Within what bf16 allows: each message rounded once and each of the n-1 additions once,
    at most (n + 1) roundings of 2^-8 of the size ``size`` of the values summed (x 1.5)."""
    tol = 1.5 * (n + 1) * UNIT_ROUNDOFF * size + 1e-30
    return bool(((got - want).abs() <= tol).all())


def described(handed: list) -> str:
    """"a float32 tensor of 1 value and a bfloat16 tensor of 707 values"."""
    parts = [f"a {d} tensor of {k} value{'s' if k != 1 else ''}" for _, d, k in handed]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def judge_handed(hook_call: dict, rank: int, index: int) -> None:
    """What one call of the hook handed to a collective: a bf16 copy of the bucket, once."""
    numel, handed = hook_call["numel"], hook_call["handed"]
    expect(handed, f"rank {rank}'s hook handed nothing to an all-reduce for bucket {index}: "
                   "each rank's gradient stays its own")
    kinds = sorted({dtype for _, dtype, _ in handed})
    expect("float16" not in kinds,
           "your hook sends float16: 2 bytes too, but only 5 bits of exponent, so a gradient "
           "above 65504 becomes inf and one below 6e-8 becomes 0; bfloat16 keeps float32's "
           "8-bit exponent, its range")
    whole = kinds == ["bfloat16"] and sum(k for *_, k in handed) == numel
    expect(len(handed) == 1 or not whole,
           f"your hook makes {len(handed)} all-reduces for one bucket of {numel} values, one "
           "per parameter: DDP hands a hook the whole bucket so that one message carries it "
           "(one start-up cost, not one per tensor); all-reduce a bf16 copy of bucket.buffer()")
    expect(len(handed) == 1,
           f"for one bucket of {numel} values your hook hands {described(handed)} to "
           "collectives: one all-reduce of the bucket's bf16 copy is all it needs (the "
           "group's size is dist.get_world_size(group), no message)")
    nbytes = numel * torch.empty(0, dtype=getattr(torch, kinds[0])).element_size()
    expect(kinds == ["bfloat16"],
           f"your hook all-reduces {kinds[0]}: {nbytes} bytes for a bucket of {numel} "
           "float32 values" + (", what DDP sends without a hook" if kinds == ["float32"]
                               else "") + "; the message of this lesson is bfloat16, 2 bytes "
           f"a value, {2 * numel} bytes")
    expect(handed[0][2] == numel, f"your hook all-reduces {handed[0][2]} values for a bucket "
                                  f"of {numel}: the message is the whole bucket, in bf16")


def judge_pass(by_rank: dict, n: int, world: int, p: int) -> None:
    """The .grad of backward pass ``p`` on every rank: the mean of the ranks' own gradients."""
    local = torch.tensor([by_rank[r]["passes"][p]["local"] for r in range(n)])  # (n, numel)
    mean, size = local.mean(0), local.abs().sum(0) / n
    for rank in range(n):
        got = torch.tensor(by_rank[rank]["passes"][p]["grad"])
        if bf16_close(got, mean, size, n):
            continue
        expect(not bf16_close(got, n * mean, n * size, n),
               "the gradients are the SUM over the ranks: DDP copies what the future holds "
               "into .grad as it is, so the hook divides by the group's size itself")
        expect(n == world or not bf16_close(got, mean * n / world, size, n),
               f"the gradients were divided by {world}, the size of the whole world, but DDP "
               f"runs on a group of {n} ranks here: take the size from the process group the "
               "hook is given")
        expect(not bf16_close(got, mean / n, size / n, n),
               f"the gradients are the mean divided by {n} once more: the group's size "
               "divides the sum once, before the all-reduce or after it, not both")
        expect(not (bf16_close(got, local[rank] / n, size, n)
                    or bf16_close(got, local[rank], size, n)),
               f"rank {rank}'s .grad holds its own gradient, not the mean over the ranks: the "
               "all-reduce's result never reached the bucket, or reached it before the "
               "all-reduce had finished (bring it back in a then() of the all-reduce's future)")
        worst = float((got - mean).abs().max())
        expect(False, f"after backward pass {p + 1}, rank {rank}'s .grad differs from the mean "
                      f"of the ranks' gradients by up to {worst:.2e}, more than bf16's "
                      "rounding allows")


def judge_bf16_case(summary: dict, by_rank: dict, run) -> None:
    n = summary["ranks"]
    for rank in range(n):
        for index, hook_call in enumerate(by_rank[rank]["hooks"]):
            judge_handed(hook_call, rank, index)
    for p in range(len(by_rank[0]["passes"])):
        judge_pass(by_rank, n, run.world_size, p)


def explain_bf16_error(error: dict, text: str) -> str | None:
    """A sentence for the errors a DDP hook meets first, or None."""
    message, source = error["message"], error["source"]
    if "'NoneType' object has no attribute 'get_future'" in message or (
            "'NoneType' object has no attribute 'wait'" in message):
        return ("dist.all_reduce returns None unless it is called with async_op=True; then it "
                "returns a handle, and the handle's get_future() a future")
    if "'NoneType' object has no attribute" in message and "group" in source:
        return ("DDP hands the hook process_group=None when it runs on the whole world: "
                "use dist.group.WORLD then (collectives take group=None as the world too)")
    if "'GradBucket' object has no attribute" in message:
        return ("the bucket's flat float32 gradients are bucket.buffer() (older torch called "
                "it get_tensor()); bucket.gradients() lists them per parameter")
    if "completed() INTERNAL ASSERT" in message:
        return ("a future's value() was read before the all-reduce had finished: read it in "
                "a function given to then(), which runs once it has, or after wait()")
    return None


@exercise("10.5")
def my_bf16_hook(path: str = MY_BF16_HOOK_FILE, world_sizes=WORLD_SIZES) -> None:
    """``bf16_hook(process_group, bucket)`` in the learner's file, as torch DDP's
    communication hook."""
    learner = find_learner_file(path, ("bf16_hook",))
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for library, name in (("course_lib.core.compress", "the course's bf16_comm_hook"),
                          ("ddp_comm_hooks", "torch's bf16_compress_hook")):
        expect(library not in text, f"your file imports {library}: {name} does what this "
                                    "exercise builds; write it with dist.all_reduce")
    check_file(learner, BF16_HOOK_CASES, {}, world_sizes, BF16_HOOK_ADVICE, judge_bf16_case,
               explain=explain_bf16_error, deadline_s=60.0)
    record_pass("10.5", path)


# ---- ZeRO-2's bucket hook: the learner's file, launched on 2, 3 and 4 processes ----------

MY_ZERO2_FILE = "workspace/my_zero2.py"
ZERO2_CASES = "course_lib.check.cases.zero2_cases"
ZERO2_ADVICE = Advice.unpaired("every rank must reduce-scatter each bucket once, in the group "
                               "it is given", calls="collectives")


def judge_hook_call(call: dict, rank: int, n: int) -> None:
    """What one call of the hook kept (the case checked piece.grad's shape), and sent."""
    expect(not call["shares_bucket"],
           f"rank {rank}'s piece.grad shares its memory with grads: the whole bucket "
           f"({call['bucket_bytes']} bytes) stays alive as long as the gradient does, and "
           "freeing it is what ZeRO-2 is for")
    reduced = sorted(ALL_REDUCES & set(call["called"]))
    expect(not reduced, f"your hook all-reduces the bucket ({reduced[0] if reduced else ''}): "
                        "every rank receives the sum of every chunk and keeps one; a "
                        "reduce-scatter hands each rank only its own chunk's sum")
    torch_rs = sorted({"reduce_scatter", "reduce_scatter_tensor"} & set(call["called"]))
    expect(not torch_rs, f"your hook calls dist.{torch_rs[0] if torch_rs else ''}: Gloo runs it "
                         "as an all-reduce of the whole bucket and keeps a slice, twice a "
                         "reduce-scatter's bytes; this exercise builds it from the ring's "
                         "first half")
    limit = call["bucket_bytes"] * (n - 1) // n
    expect(call["sent"] <= limit, f"rank {rank} sent {call['sent']} bytes for a bucket of "
                                  f"{call['bucket_bytes']}: a reduce-scatter sends (N-1)/N of "
                                  f"the bucket, {limit} bytes on {n} ranks")


def close(got: list, want: list) -> bool:
    return torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-9, atol=1e-12)


def judge_zero2_step(spec: dict, got: list, rank: int, step: int, world: int) -> None:
    """Why rank ``rank``'s parameters after ``step`` are not plain data parallelism's."""
    n = spec["ranks"]
    expect(not close(got, zero2_cases.reference(spec, grad_scale=n)[step]),
           "the step used the SUM of the ranks' gradients: the reduce-scatter adds them up, "
           "and plain data parallelism steps with their mean")
    expect(n == world or not close(got, zero2_cases.reference(spec, grad_scale=n / world)[step]),
           f"the gradients were divided by {world}, the size of the whole world, but this "
           f"group has {n} ranks: take the size from the group your hook is given")
    expect(spec["accum"] == 1 or not close(
        got, zero2_cases.reference(spec, last_micro_only=True)[step]),
        f"with {spec['accum']} backward passes before the step, only the last one's gradient "
        "counted: each backward calls the hook once per bucket, and what an earlier one left "
        "in piece.grad must stay in the sum")
    gap = float((torch.tensor(got) - torch.tensor(zero2_cases.reference(spec)[step])).abs().max())
    expect(False, f"after step {step + 1}, rank {rank}'s parameters differ from plain data "
                  f"parallelism by up to {gap:.2e}")


def judge_chunks(by_rank: dict, n: int) -> None:
    """Each rank must keep its own chunk: rank r's is values r*s .. (r+1)*s of the bucket."""
    for rank in range(n):
        for hook_call in by_rank[rank]["hooks"]:
            k, s = hook_call["took_chunk"], hook_call["s"]
            if k is not None and k != rank:
                expect(False, f"rank {rank}'s piece.grad got the mean of chunk {k} of the "
                              f"bucket (values {k * s}..{(k + 1) * s - 1}), but rank {rank}'s "
                              f"piece is chunk {rank}, values {rank * s}..{(rank + 1) * s - 1}")


def judge_zero2_case(summary: dict, by_rank: dict, run) -> None:
    n = summary["ranks"]
    spec = {s["name"]: s for s in zero2_cases.case_specs(run.world_size, {})}[summary["name"]]
    want = zero2_cases.reference(spec)
    if any(not close(by_rank[r]["after"][-1], want[-1]) for r in range(n)):
        judge_chunks(by_rank, n)  # wrong values: first, whose chunk did each rank keep?
    for step in range(spec["steps"]):
        for rank in range(n):
            got = by_rank[rank]["after"][step]
            if not close(got, want[step]):
                judge_zero2_step(spec, got, rank, step, run.world_size)
    for rank in range(n):  # right values: then what the hook kept and sent
        for hook_call in by_rank[rank]["hooks"]:
            judge_hook_call(hook_call, rank, n)


@exercise("10.6")
def my_zero2(path: str = MY_ZERO2_FILE, world_sizes=WORLD_SIZES) -> None:
    """``reduce_scatter_bucket(grads, piece, group)`` in the learner's file, as Zero2's hook."""
    learner = find_learner_file(path, ("reduce_scatter_bucket",))
    check_file(learner, ZERO2_CASES, {}, world_sizes, ZERO2_ADVICE, judge_zero2_case,
               deadline_s=60.0)
    record_pass("10.6", path)


# ---- ZeRO-3's moments for one wrapped module: the learner's file, on 2, 3 and 4 processes -

MY_FLAT_SHARD_FILE = "workspace/my_flat_shard.py"
SHARD_UNIT_CASES = "course_lib.check.cases.shard_unit_cases"
SHARD_UNIT_ADVICE = Advice.unpaired("every rank must gather and reduce-scatter each module at "
                                    "the same moments, with the unit's own group",
                                    calls="collectives")


def same_values(got: dict, want: dict) -> list[str]:
    """The names of the parameters whose values differ."""
    return [k for k in want if not close(got[k], want[k])]


def judge_loss(got: float, want: float, rank: int, forward: int) -> None:
    expect(math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12),
           f"rank {rank}'s loss in forward {forward + 1} is {got:.6f}, plain data "
           f"parallelism's {want:.6f}: " + (
               "the first forward computed with other numbers than the model's, so the "
               "gathered parameters are not every rank's shard, each in its place"
               if forward == 0 else "the parameters it computed with were not the same"))


def judge_shard_unit_case(summary: dict, by_rank: dict, run) -> None:
    """The first forward's losses, then the parameters after the steps, then every loss."""
    n = summary["ranks"]
    spec = {s["name"]: s for s in shard_unit_cases.case_specs(run.world_size, {})}[
        summary["name"]]
    losses, params = shard_unit_cases.reference(spec)
    for rank in range(n):
        judge_loss(by_rank[rank]["losses"][0], losses[0][rank], rank, 0)
    for rank in range(n):
        wrong = same_values(by_rank[rank]["params"], params)
        expect(not wrong or same_values(by_rank[rank]["params"],  # stepped with the sum?
                                        shard_unit_cases.reference(spec, grad_scale=n)[1]),
               "the steps used the SUM of the ranks' gradients: the reduce-scatter adds them "
               "up, and plain data parallelism steps with their mean")
        expect(not wrong or spec["accum"] == 1,
               f"after {spec['accum']} backward passes and one step, rank {rank}'s "
               f"{', '.join(wrong[:1])} differs from plain data parallelism's: each backward "
               "calls reduce_grad once, and what an earlier one left in unit.shard.grad must "
               "stay in the sum")
        expect(not wrong, f"after {spec['steps']} steps, rank {rank}'s {', '.join(wrong[:1])} "
                          "differs from plain data parallelism's, though the first forward "
                          "was right: look at the gradient each shard gets")
        for i in range(1, len(losses)):
            judge_loss(by_rank[rank]["losses"][i], losses[i][rank], rank, i)


@exercise("10.7")
def my_flat_shard(path: str = MY_FLAT_SHARD_FILE, world_sizes=WORLD_SIZES) -> None:
    """``unshard(unit)``, ``reshard(unit)`` and ``reduce_grad(unit)`` in the learner's file,
    as the moments of the course's fully sharded modules."""
    learner = find_learner_file(path, ("unshard", "reshard", "reduce_grad"))
    check_file(learner, SHARD_UNIT_CASES, {}, world_sizes, SHARD_UNIT_ADVICE,
               judge_shard_unit_case, deadline_s=60.0)
    record_pass("10.7", path)
