"""Exercise checkers of notebook 04 against the reference answers and realistic wrong ones."""

import pytest
import torch

from course_lib.check.core import ExerciseError
from course_lib.check.nb04 import average_gradients, shard, warmup
from course_lib.lessons import replicas


def by_parameter(replica_list):
    return zip(*(r.parameters() for r in replica_list), strict=True)


def test_average_gradients(capsys):
    average_gradients(replicas.average_gradients)
    assert capsys.readouterr().out == "Exercise 4.1: correct.\n"

    def summed(replica_list):
        for params in by_parameter(replica_list):
            total = torch.stack([p.grad for p in params]).sum(dim=0)
            for p in params:
                p.grad.copy_(total)

    def only_rank_0(replica_list):
        for params in by_parameter(replica_list):
            params[0].grad.copy_(torch.stack([p.grad for p in params]).mean(dim=0))

    def each_its_own_order(replica_list):  # every replica sums in a different order
        for params in by_parameter(replica_list):
            grads = [p.grad.clone() for p in params]
            for rank, p in enumerate(params):
                order = grads[rank:] + grads[:rank]
                total = order[0] * 1.0000001
                for g in order[1:]:
                    total = total + g
                p.grad.copy_(total / len(grads))

    with pytest.raises(ExerciseError, match="divide by the number of replicas"):
        average_gradients(summed)
    with pytest.raises(ExerciseError, match="replica 1 does not hold the mean"):
        average_gradients(only_rank_0)
    with pytest.raises(ExerciseError, match="bitwise"):
        average_gradients(each_its_own_order)


def test_shard(capsys):
    shard(replicas.shard)
    assert "Exercise 4.2: correct." in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="interleaves"):
        shard(lambda x, rank, world: x[rank::world])
    with pytest.raises(ExerciseError, match="raise ValueError"):
        shard(lambda x, rank, world: x[rank * (len(x) // world):(rank + 1) * (len(x) // world)])
    with pytest.raises(ExerciseError, match="each row once"):
        shard(lambda x, rank, world: x[rank:rank + len(x) // world])  # overlapping windows


def test_warmup(capsys):
    warmup(replicas.warmup_lr)
    assert "Exercise 4.3: correct." in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="wasted step"):
        warmup(lambda step, peak, warm: peak * min(1.0, step / warm))
    with pytest.raises(ExerciseError, match="past the peak"):
        warmup(lambda step, peak, warm: peak * (step + 1) / warm)
    with pytest.raises(ExerciseError, match="expected"):
        warmup(lambda step, peak, warm: peak * min(1.0, (step + 1) / (warm + 1)))


def test_not_done_yet(capsys):
    def hole(*args):
        raise NotImplementedError

    average_gradients(hole)
    shard(hole)
    warmup(hole)
    out = capsys.readouterr().out
    assert out.count("not done yet") == 3
