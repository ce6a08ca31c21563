"""The capstone's lessons: measured memory (capstone.py), the budget's model (budget.py), and
the reference trainer of exercise 11.1 run from its own command line."""

import math
from types import SimpleNamespace

import pytest
import torch
from answer_edits import reference

from course_lib.lessons import budget, capstone
from course_lib.lessons.budget import Budget, Machine, Plan
from course_lib.lessons.capstone import KIB
from course_lib.runtime.launch import launch
from course_lib.tasks.models import count_parameters, parameter_checksum
from course_lib.train.config import TrainConfig
from course_lib.train.trainer import build

SIZES = (1, 2, 4, 8, 16)


def test_the_measured_model_is_the_trainers():
    theirs, _ = build(TrainConfig(), SimpleNamespace(device=torch.device("cpu")))
    assert parameter_checksum(capstone.trainer_model()) == parameter_checksum(theirs)


def test_memory_parts_add_up_and_activations_grow_linearly():
    model = capstone.trainer_model()
    params = 4 * count_parameters(model)  # float32: 4 bytes a number
    tensors = len(list(model.parameters()))
    rows = [capstone.memory_per_process(b) for b in SIZES]
    for row in rows:
        assert row["parameters"] == params and row["gradients"] == params
        # AdamW: two moments per parameter, plus a small step counter per tensor
        assert 2 * params <= row["optimizer state"] <= 2 * params + 8 * tensors
        assert row["total"] == sum(row[k] for k in capstone.PARTS)
    activations = [row["activations"] for row in rows]
    slope = activations[1] - activations[0]
    assert slope > 0
    for b, measured in zip(SIZES, activations, strict=True):
        assert measured == activations[0] + slope * (b - 1)  # exactly linear in the batch


def test_memory_of_a_plan_adds_buckets_and_shards_the_optimizer_with_zero1():
    parts = capstone.memory_per_process(4)
    plain = budget.memory_kib(Plan(4, 2, 4, 64, zero1=False))
    sharded = budget.memory_kib(Plan(4, 2, 4, 64, zero1=True))
    assert plain["buckets"] == plain["gradients"] == parts["gradients"] / KIB
    assert plain["optimizer state"] == 4 * sharded["optimizer state"]  # 1/N on each of 4
    assert plain["total"] == pytest.approx(sum(v for k, v in plain.items() if k != "total"))
    assert plain["total"] - sharded["total"] == pytest.approx(
        parts["optimizer state"] / KIB * 3 / 4)


def test_compute_time_is_micro_steps_times_their_cost():
    m = Machine()
    for b, k in ((1, 32), (4, 8), (8, 4)):
        ms = budget.step_ms(Plan(b, k, 1, 64, False), m)
        assert ms["communication"] == 0
        assert ms["compute"] == pytest.approx(k * (m.micro_step_ms + m.per_example_ms * b))
    # fewer, larger micro-steps are cheaper: the overhead is paid once per micro-step
    assert budget.step_ms(Plan(8, 4, 1, 64, False))["total"] < \
        budget.step_ms(Plan(1, 32, 1, 64, False))["total"]


def test_buckets_cut_the_gradient_and_trade_latency_for_overlap():
    assert budget.bucket_sizes(100, 30) == [30, 30, 30, 10]
    assert budget.bucket_sizes(100, 1000) == [100]
    comm = {kib: budget.step_ms(Plan(4, 2, 4, kib, False))["communication"]
            for kib in (16, 64, 1024)}
    assert comm[64] < comm[16]  # tiny buckets pay the latency again and again
    assert comm[64] < comm[1024]  # one bucket cannot start before backward ends
    m, grad = Machine(), capstone.memory_per_process(1)["gradients"]
    one_bucket = 1e3 * 2 * 3 * m.link.time_s(grad / 4)  # ring: 2(N-1) messages of 1/N
    assert comm[1024] == pytest.approx(one_bucket)


def test_zero1_halves_the_messages_then_adds_an_all_gather():
    m, grad = Machine(), capstone.memory_per_process(1)["gradients"]
    plain = budget.step_ms(Plan(8, 2, 2, 1024, False))["communication"]
    zero1 = budget.step_ms(Plan(8, 2, 2, 1024, True))["communication"]
    assert plain == pytest.approx(1e3 * 2 * m.link.time_s(grad / 2))
    assert zero1 == pytest.approx(2 * 1e3 * m.link.time_s(grad / 2))  # RS + AG, one each


def test_some_plans_miss_each_limit_and_few_fit():
    c = Budget()
    plans = [Plan(b, 32 // (n * b), n, kib, z) for n in (1, 2, 4) for b in (1, 2, 4, 8, 16, 32)
             if 32 % (n * b) == 0 for kib in (16, 64, 1024) for z in (False, True)]
    verdicts = [budget.verdict(p, c) for p in plans]
    memory_only = [v for v in verdicts if len(v) == 1 and v[0].startswith("memory")]
    time_only = [v for v in verdicts if len(v) == 1 and v[0].startswith("time")]
    fit = [p for p, v in zip(plans, verdicts, strict=True) if not v]
    assert memory_only and time_only and any(len(v) == 2 for v in verdicts)
    assert 0 < len(fit) < len(plans) / 10
    assert all(p.nproc == 4 for p in fit)  # on fewer processes the compute alone is too slow
    for p in plans:
        seconds = budget.run_seconds(p, c)
        assert math.isclose(seconds, c.steps * budget.step_ms(p)["total"] / 1e3)


@pytest.mark.slow
def test_the_reference_trainer_runs_from_its_command_line(tmp_path):
    path = tmp_path / "capstone_trainer.py"
    path.write_text(reference("capstone_trainer.py"))  # the answer cell of notebook 11
    run = launch(str(path), 2, timeout_s=300, quiet=True)
    losses = [float(line.rsplit(" ", 1)[1]) for line in run.output.splitlines()
              if "loss" in line]
    assert len(losses) == 4 and losses[-1] < losses[0]
