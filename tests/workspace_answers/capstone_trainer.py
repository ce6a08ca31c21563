"""The capstone's trainer: one data-parallel optimizer step with gradient accumulation.

    torchrun --nproc-per-node 2 workspace/capstone_trainer.py

Any world size. The checker calls the three functions below on 2 processes, with the model
wrapped in torch's DistributedDataParallel, and compares what they do with one big batch.
"""

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from course_lib.core.accumulation import count_target_tokens, sum_token_loss


def same_start(module, group=None):
    """Every rank starts from rank 0's weights."""
    with torch.no_grad():
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0, group=group)  # rank 0 sends, the others receive


def train_step(model, optimizer, micro_batches, group=None):
    """Accumulate over this rank's micro-batches, sync once, step; return the step's loss:
    the mean over every scored token of the global batch, the same number on every rank."""
    world_size, accum_steps = dist.get_world_size(group), len(micro_batches)
    global_tokens = sum(count_target_tokens(mb.targets) for mb in micro_batches)
    dist.all_reduce(global_tokens, group=group)  # scored tokens on every rank together
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64)
    for k, mb in enumerate(micro_batches):
        last = k == accum_steps - 1
        with nullcontext() if last else model.no_sync():  # forward AND backward inside
            token_losses = sum_token_loss(model(mb.inputs), mb.targets)  # (B, T) -> ()
            loss = token_losses * world_size / global_tokens  # DDP divides by world_size
            loss.backward()  # .grad += this micro-step's share
        loss_sum += token_losses.detach().double()
    optimizer.step()
    dist.all_reduce(loss_sum, group=group)  # every rank's token losses
    return float(loss_sum / global_tokens)


def epoch_orders(dataset, epochs, group=None):
    """The example indices this rank trains on, one list per epoch."""
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(group),
                                 rank=dist.get_rank(group), shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        orders.append(list(sampler))
    return orders


if __name__ == "__main__":  # 20 steps of the sums task, a global batch of 32
    from torch.nn.parallel import DistributedDataParallel

    from course_lib.lessons.capstone import trainer_model
    from course_lib.runtime.worker import print0, worker
    from course_lib.tasks.batching import micro_batches_of_rank
    from course_lib.tasks.sequences import global_batch

    with worker(seed=0) as w:
        module = trainer_model()
        same_start(module, w.group)
        model = DistributedDataParallel(module, process_group=w.group)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(20):
            batch = global_batch(seed=0, step=step, size=32)  # the same on every rank
            mine = micro_batches_of_rank(batch, w.rank, w.world_size, accum_steps=2)
            loss = train_step(model, optimizer, mine, w.group)
            if step % 5 == 4:
                print0(w, f"step {step + 1}: loss {loss:.3f}")
