"""The capstone trainer's cases (exercise 11.1), run by ``course_lib.check.mp.program``.

Each case runs the learner's functions and, on the same rank, the reference they must equal:
one big batch through an unwrapped copy of the model, on one process, in float64. Nothing of
the reference needs a message, so a learner's missing collective cannot hide it.

    one micro-step        1 process, 1 micro-step: train_step against the big batch
    K micro-steps         1 process, 4 micro-steps
    N processes           every process, 2 micro-steps each: gradients, syncs, weights, loss
    epochs                epoch_orders over 3 epochs: who gets which example, when
    same start            weights from another seed on each rank, then same_start (last: a
                          rank that skips a collective leaves its peer waiting, see nb11)

The judge (``course_lib.check.nb11``) reads the summaries rung by rung.
"""

from __future__ import annotations

import copy
import hashlib

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from course_lib.check.mp.tracer import Tracer
from course_lib.core.accumulation import count_target_tokens, sum_token_loss
from course_lib.tasks.batching import micro_batches_of_rank
from course_lib.tasks.models import TransformerConfig, make_transformer
from course_lib.tasks.sequences import VOCAB, global_batch, input_length

GLOBAL_BATCH = 8  # examples per optimizer step: small for speed, sums of 1 to 3 digits
MAX_DIGITS = 3
LR = 0.1  # plain SGD: the new weights are a linear function of the gradient
DATASET_SIZE = 10  # examples that epoch_orders shares out (uneven on 3 or 4 ranks: padded)
EPOCHS = 3
CASES = (("one micro-step", 1, 1), ("K micro-steps", 1, 4), ("N processes", None, 2))


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": name, "ranks": ranks or world_size, "accum_steps": accum}
             for name, ranks, accum in CASES]
    return specs + [{"name": "epochs", "ranks": world_size},
                    {"name": "same start", "ranks": world_size}]


def small_model(seed: int) -> torch.nn.Module:
    """A tiny transformer for the sums task, in float64 so that equal means equal."""
    shape = TransformerConfig(len(VOCAB), input_length(MAX_DIGITS), 16, 2, 1, 0.0)
    return make_transformer(shape, seed=seed).double()


def weights_digest(module: torch.nn.Module) -> str:
    """A fingerprint of every weight, bit for bit."""
    h = hashlib.sha256()
    for tensor in module.state_dict().values():
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def reference_step(model: torch.nn.Module, batch) -> tuple[list[torch.Tensor], float]:
    """The gradient and the loss of one big batch: the mean over its scored tokens."""
    tokens = count_target_tokens(batch.targets)
    loss = sum_token_loss(model(batch.inputs), batch.targets) / tokens
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()], float(loss.detach())


def compare(grads: list, reference: list) -> dict:
    """How far the learner's gradient is from the big batch's (as one long vector)."""
    if any(g is None for g in grads):
        return {"grad_error": None, "grad_ratio": None}
    got, want = torch.cat([g.flatten() for g in grads]), torch.cat([r.flatten()
                                                                    for r in reference])
    error = float((got - want).abs().max() / want.abs().max())
    return {"grad_error": error, "grad_ratio": float(got.norm() / want.norm())}


def micro_mean_loss(model, micro_batches) -> float:
    """The loss as the mean of micro-batch means (what a loss log must NOT be)."""
    with torch.no_grad():
        means = torch.stack([sum_token_loss(model(mb.inputs), mb.targets)
                             / count_target_tokens(mb.targets) for mb in micro_batches])
    return float(means.mean())  # this rank's only: a hint, not a verdict


def run_step_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer) -> dict:
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    module = small_model(seed=0)  # the same weights on every rank
    reference = copy.deepcopy(module)
    batch = global_batch(seed=0, step=0, size=GLOBAL_BATCH, max_digits=MAX_DIGITS)
    ref_grads, ref_loss = reference_step(reference, batch)
    mine = micro_batches_of_rank(batch, rank, world_size, spec["accum_steps"])
    hinted = micro_mean_loss(reference, mine)
    model = DistributedDataParallel(module, process_group=group)
    syncs = [0]

    def counting_hook(state, bucket):  # DDP calls it once per bucket it all-reduces
        syncs[0] += 1
        return allreduce_hook(group, bucket)

    model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    with tracer.watching(spec["name"], range(spec["ranks"])):
        loss = learner.train_step(model, optimizer, mine, group)
    grads = [p.grad for p in module.parameters()]
    return {"name": spec["name"], "ranks": spec["ranks"], "accum_steps": spec["accum_steps"],
            **compare(grads, ref_grads), "syncs": syncs[0],
            "loss": float(loss) if isinstance(loss, (int, float, torch.Tensor)) else None,
            "ref_loss": ref_loss, "micro_mean_loss": hinted, "digest": weights_digest(module)}


def run_epochs_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer) -> dict:
    with tracer.watching(spec["name"], range(spec["ranks"])):
        orders = learner.epoch_orders(range(DATASET_SIZE), EPOCHS, group)
    orders = [[int(i) for i in order] for order in orders]
    return {"name": spec["name"], "ranks": spec["ranks"], "orders": orders,
            "dataset_size": DATASET_SIZE}


def run_start_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer) -> dict:
    rank = dist.get_rank(group)
    module = small_model(seed=100 + rank)  # each rank its own weights, until same_start
    with tracer.watching(spec["name"], range(spec["ranks"])):
        learner.same_start(module, group)
    return {"name": spec["name"], "ranks": spec["ranks"], "digest": weights_digest(module),
            "rank0_digest": weights_digest(small_model(seed=100))}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    if spec["name"] == "epochs":
        return run_epochs_case(learner, spec, group, tracer)
    if spec["name"] == "same start":
        return run_start_case(learner, spec, group, tracer)
    return run_step_case(learner, spec, group, tracer)
