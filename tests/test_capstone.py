"""The capstone's lessons: the measured memory and the model's layout (capstone.py), and the
reference trainer of exercise 11.1 run from its own command line. The budget built on them:
tests/test_budget.py."""

from types import SimpleNamespace

import pytest
import torch
from answer_edits import reference

from course_lib.lessons import capstone
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


def test_the_layout_is_the_models_gradients_and_fully_shards_modules():
    model = capstone.trainer_model()
    assert capstone.gradient_bytes() == tuple(4 * p.numel() for p in model.parameters())
    units = dict(capstone.shard_units())
    assert list(units) == ["root", "block 0", "block 1"]
    assert sum(units.values()) == sum(capstone.gradient_bytes())
    assert units["block 0"] == 4 * count_parameters(model.blocks[0])


@pytest.mark.slow
def test_the_reference_trainer_runs_from_its_command_line(tmp_path):
    path = tmp_path / "capstone_trainer.py"
    path.write_text(reference("capstone_trainer.py"))  # the answer cell of notebook 11
    run = launch(str(path), 2, timeout_s=300, quiet=True)
    losses = [float(line.rsplit(" ", 1)[1]) for line in run.output.splitlines()
              if "loss" in line]
    assert len(losses) == 4 and losses[-1] < losses[0]
