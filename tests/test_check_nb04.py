"""Notebook 04's checkers: the reference answers pass; realistic wrong answers (of the wrong
kind, calling the course's replicas.* that the notebook uses, summing, interleaving, a late or
wasted warmup step) get the hint that names their mistake, in a short report without checker
code."""

from fractions import Fraction

import numpy as np
import torch
from check_reports import standard_tests
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course_lib.check.nb04 import average_gradients, shard, warmup
from course_lib.lessons import replicas


def by_parameter(replica_list):
    return zip(*(r.parameters() for r in replica_list), strict=True)


def right_average(replica_list):
    for params in by_parameter(replica_list):
        mean = torch.stack([p.grad for p in params]).mean(dim=0)
        for p in params:
            p.grad.copy_(mean)


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


def returns_the_means(replica_list):  # computes the means but does not write them back
    return [torch.stack([p.grad for p in params]).mean(dim=0)
            for params in by_parameter(replica_list)]


def one_shared_mean(replica_list):  # every replica's .grad becomes the same tensor
    for params in by_parameter(replica_list):
        mean = torch.stack([p.grad for p in params]).mean(dim=0)
        for p in params:
            p.grad = mean


def one_flat_buffer(replica_list):  # vector_to_parameters points every .grad into one buffer
    flats = [parameters_to_vector([p.grad for p in r.parameters()]) for r in replica_list]
    mean = torch.stack(flats).mean(dim=0)
    for r in replica_list:
        vector_to_parameters(mean, [p.grad for p in r.parameters()])


def new_grad_tensors(replica_list):  # right values, each in a new tensor of its own
    for params in by_parameter(replica_list):
        mean = torch.stack([p.grad for p in params]).mean(dim=0)
        for p in params:
            p.grad = mean.clone()


def drops_the_last_grads(replica_list):
    right_average(replica_list)
    for p in replica_list[-1].parameters():
        p.grad = None


AVERAGE_MISTAKES = [
    (summed, "replica 0 holds the sum of the gradients, not their mean"),
    (only_rank_0, "replica 1 does not hold the mean gradient"),
    (each_its_own_order, "close but not bitwise equal"),
    (returns_the_means, "your function returns a list"),
    (drops_the_last_grads, "replica 2 has parameters without .grad"),
    (one_shared_mean, "replicas 0 and 1 share one .grad in memory"),
    (one_flat_buffer, "replicas 0 and 1 share one .grad in memory"),
    (new_grad_tensors, "replica 0's .grad is a new tensor, not the one backward left"),
    (replicas.average_gradients, "calls replicas.average_gradients, the course's own version"),
]


def right_in_place_each(replica_list):  # a sum written into each .grad, then scaled
    for params in by_parameter(replica_list):
        total = sum(p.grad for p in params)
        for p in params:
            p.grad[...] = total
            p.grad.mul_(1.0 / len(params))


def right_shard(x, rank, world):
    rows, left = divmod(len(x), world)
    if left:
        raise ValueError(f"{len(x)} rows do not split over {world} ranks")
    return x[rank * rows:(rank + 1) * rows]


def wrong_error(x, rank, world):
    if len(x) % world:
        raise RuntimeError("uneven")
    return right_shard(x, rank, world)


SHARD_MISTAKES = [
    (lambda x, rank, world: x[rank::world], "a rank gets every world_size-th row"),
    (lambda x, rank, world: x[rank * (len(x) // world):(rank + 1) * (len(x) // world)],
     "yet your function returned a shard"),
    (lambda x, rank, world: x.chunk(world)[rank], "yet your function returned a shard"),
    (lambda x, rank, world: x[rank:rank + len(x) // world],
     "some rows are missing and others repeated"),
    (lambda x, rank, world: x[rank * 2:(rank + 1) * 2], "yours hold [2]"),
    (lambda x, rank, world: right_shard(x, rank, world).tolist(),
     "return the rank's rows as a tensor (a slice of x); your code returned a list"),
    (replicas.shard, "calls replicas.shard, the course's own version"),
    (wrong_error, "10 rows do not split into 4 equal shards: the exercise asks for a ValueError "
                  "here, not the RuntimeError your code raised"),
]


def as_library(step, peak_lr, warmup_steps):
    return replicas.warmup_lr(step, peak_lr, warmup_steps)


WARMUP_MISTAKES = [
    (lambda step, peak, warm: peak * min(1.0, step / warm), "step 0 gets learning rate 0, a "
                                                            "wasted step"),
    (lambda step, peak, warm: peak * (step + 1) / warm, "the rate goes past the peak"),
    (lambda step, peak, warm: peak * min(1, (step + 1) // warm),
     "your rate is 0 and then jumps to the peak, with no ramp between"),
    (lambda step, peak, warm: peak * min(1.0, (step + 1) / (warm + 1)),
     "at step 3, the last warmup step, your rate is 0.32, not yet the peak"),
    (lambda step, peak, warm: peak * min(1.0, ((step + 1) / warm) ** 2),
     "the ramp does not rise by equal steps"),
    (lambda step, peak, warm: [peak * min(1.0, (s + 1) / warm) for s in range(step + 1)],
     "return the learning rate of that one step, a number; your code returned a list"),
    (lambda step, peak, warm: np.float32(peak * min(1.0, step / warm)), "step 0 gets learning "
                                                                       "rate 0, a wasted step"),
    (lambda step, peak, warm: f"{peak * min(1.0, (step + 1) / warm):.3f}",
     "a number; your code returned the str"),
    (as_library, "calls replicas.warmup_lr, the course's own version"),
]


test_right_answers_pass, test_wrong_answers_get_their_hint_only, test_open_answers = \
    standard_tests((average_gradients, [right_average, right_in_place_each], AVERAGE_MISTAKES),
                   (shard, [right_shard], SHARD_MISTAKES),
                   (warmup, [lambda step, peak, warm: peak * min(1.0, (step + 1) / warm),
                             lambda step, peak, warm:  # float32 and Fraction rates too
                             np.float32(peak * min(1.0, (step + 1) / warm)),
                             lambda step, peak, warm:
                             Fraction(peak) * min(1, Fraction(step + 1, warm))],
                    WARMUP_MISTAKES, ("(step + 1)", "min(")))  # no formula given away
