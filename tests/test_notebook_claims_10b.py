"""The claims of notebook 10b (ZeRO-2 and ZeRO-3), checked again outside the notebook: on the
demo's model, in the notebook's saved outputs, and (slow) in a 2-process run of the demo.

(Zero2, fully_shard, prefetching and bf16 compression against torch: tests/test_zero2.py and
tests/test_fully_shard.py.)"""

import ast
import inspect
import re
from pathlib import Path

import nbformat
import pytest
import torch
from answer_edits import reference

from course_lib.core import flat_shard
from course_lib.core.fully_shard import MixedPrecisionPolicy, fully_shard
from course_lib.demos.sharding_demo import Stack, new_model
from course_lib.runtime.launch import launch

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "10b_sharding_everything.ipynb"


def saved_output() -> str:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)


def test_the_model_divides_into_four_equal_chunks_per_module():
    model = new_model()
    assert isinstance(model, Stack) and sum(p.numel() for p in model.parameters()) == 4644
    root = sum(p.numel() for m in (model.into, model.out) for p in m.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    assert (4 * root, 4 * blocks[0]) == (1680, 4224)  # the notebook's root and one block
    assert all(n % 4 == 0 for n in (root, *blocks))  # no padding on 1, 2 or 4 ranks
    assert torch.equal(new_model().out.weight, model.out.weight)  # every rank: one start


def test_saved_losses_are_bitwise_on_two_ranks_and_within_1e_5_on_four():
    text = saved_output()
    gaps = re.findall(r"(\d) process\(es\): zero\d against +[\w ]+: largest loss difference "
                      r"(0, bit for bit|~\S+ \(tolerance 1e-5\))", text)
    assert len(gaps) == 9
    assert all(gap == "0, bit for bit" for n, gap in gaps if int(n) <= 2)
    assert all(float(gap.split()[0].lstrip("~")) <= 1e-5 for n, gap in gaps if int(n) > 2)


def test_saved_memory_bytes_and_timeline_match_the_table():
    text = saved_output()
    assert "4  zero2   18,576    4,644    9,324" in text  # params whole, the rest / 4
    assert "4  zero3    4,644    4,644    9,308" in text  # everything / 4
    assert "ZeRO-2 27,864, ZeRO-3 41,796 (1.50x)" in text
    assert "plain DP 27,864 bytes" in text
    assert "5,904 = the root 1,680 + one block 4,224" in text
    assert "fp32 18,576, bf16 9,288" in text
    error = float(re.search(r"relative to its largest value: (\S+) ", text).group(1))
    assert 0 < error < 2 ** -7


@pytest.mark.slow
def test_the_demo_on_two_processes_keeps_every_claim():
    run = launch("course_lib.demos.sharding_demo", nproc=2, timeout_s=300, quiet=True)
    numel = 4644
    for n, ranks in run.result["by_size"].items():
        n = int(n)
        for r in ranks:
            runs = r["runs"]
            for kind in ("zero2", "zero3", "torch fsdp"):
                assert runs[kind]["losses"] == runs["ddp"]["losses"], (n, kind)  # bitwise
            assert (runs["zero2"]["params"], runs["zero2"]["grads"]) == (4 * numel,
                                                                         4 * numel // n)
            assert runs["zero3"]["params"] == runs["zero3"]["grads"] == 4 * numel // n
            assert runs["zero3"]["state"] == 8 * numel // n + 4 * runs["zero3"]["state_tensors"]
            assert runs["zero2"]["sent_per_step"] == r["plain_sent_per_step"]
            assert 2 * runs["zero3"]["sent_per_step"] == 3 * r["plain_sent_per_step"]
    whole = [w for *_, w in run.result["timeline"]]
    assert max(whole) == 1680 + 4224 and whole[-1] == 0
    c = run.result["compression"]
    assert 2 * c["bf16_bytes"] == c["fp32_bytes"] and 0 < c["relative_error"] < 2 ** -7
    fetched = run.result["prefetching"]  # the same numbers; one block (4,224 bytes) more whole
    assert fetched["prefetch"]["losses"] == fetched["plain"]["losses"]
    assert fetched["plain"]["peak_whole_bytes"] == 1680 + 4224
    assert fetched["prefetch"]["peak_whole_bytes"] == 1680 + 2 * 4224


# ---- what the notebook shows above exercises 10.6 and 10.7 --------------------------------------

def shown_above(exercise: str) -> list[str]:
    """The code the notebook shows (``show(...)``) for an exercise, hidden in a student copy."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"
            and re.match(r"show\(.*exercise=\"" + re.escape(exercise) + '"', c.source)]


def test_10_6s_gradient_hook_is_shown_only_once_the_exercise_is_passed():
    """The defining act of ZeRO-2 (copy into the bucket, free .grad, launch in order) is the
    exercise's: shown tagged, and the learner's file defines it."""
    shown = " ".join(shown_above("10.6"))
    assert "zero2.Zero2.gradient_ready" in shown and "zero2.reduce_scatter_bucket" in shown
    answer = ast.parse(reference("my_zero2.py"))
    defined = {n.name: [a.arg for a in n.args.args] for n in answer.body
               if isinstance(n, ast.FunctionDef)}
    assert defined == {"gradient_ready": ["zero2", "param"],
                       "reduce_scatter_bucket": ["grads", "piece", "group"]}


def test_10_7s_functions_are_shown_with_the_exercises_signatures():
    """Section 2 shows the three moments as the exercise asks for them: functions of the unit,
    returning nothing, casting nothing; and says how a tensor gives its memory back before
    the exercise (and its hints) do."""
    shown = " ".join(shown_above("10.7"))
    names = ("unshard", "reshard", "reduce_grad")
    assert all(f"flat_shard.{name}" in shown for name in names) and "FlatShard." not in shown
    answer = ast.parse(reference("my_flat_shard.py"))
    asked = {n.name: [a.arg for a in n.args.args] for n in answer.body
             if isinstance(n, ast.FunctionDef)}
    for name in names:
        function = getattr(flat_shard, name)
        assert list(inspect.signature(function).parameters) == asked[name] == ["unit"]
        code = inspect.getsource(function)
        assert ".to(" not in code and "async_op=False" not in code, name
        assert not [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Return)
                    and n.value is not None], name  # no handle handed back
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = [c.source for c in nb.cells if c.cell_type == "markdown"]
    told = next(i for i, t in enumerate(text) if "untyped_storage().resize_(0)" in t)
    asked_at = next(i for i, t in enumerate(text) if t.startswith("**Exercise 10.7"))
    assert told < asked_at


def test_the_courses_zero3_refuses_a_reduce_dtype_of_its_own(one_process_group):
    """It reduces in param_dtype, as its reduce_grad shows: another reduce_dtype is refused at
    wrapping, not ignored."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with pytest.raises(ValueError, match="a reduce_dtype of its own"):
        fully_shard(torch.nn.Linear(3, 2), mp_policy=policy)
    same = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    fully_shard(torch.nn.Linear(3, 2), mp_policy=same)
