"""Wrong: finish() copies every bucket into .grad first, then waits for them all.

    torchrun --nproc-per-node 3 workspace/my_hooks.py

Any world size; Gloo on CPUs, NCCL with one GPU per process. Used like the hooks inside DDP:

    hooks = BucketHooks(model, group=None, bucket_cap_mb=25)
    loss.backward()    # each full bucket's all-reduce starts from a gradient hook
    hooks.finish()     # wait for them, divide by the world size, copy into .grad
    optimizer.step()
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

MB = 1024 * 1024  # bytes in a megabyte, as DDP's bucket_cap_mb counts them


class BucketHooks:
    """Average every gradient over the ranks of ``group``, bucket by bucket, during backward."""

    def __init__(self, model, group=None, bucket_cap_mb=25.0):
        self.group = group
        self.world_size = dist.get_world_size(group)
        params = [p for p in model.parameters() if p.requires_grad][::-1]  # last layer first
        self.buckets = [[]]  # lists of parameters, in the order backward fills them
        filled, cap = 0, bucket_cap_mb * MB
        for p in params:  # close a bucket when the next gradient would not fit (exercise 8.1)
            size = p.numel() * p.element_size()
            if self.buckets[-1] and filled + size > cap:
                self.buckets.append([])
                filled = 0
            self.buckets[-1].append(p)
            filled += size
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype,
                                 device=b[0].device) for b in self.buckets]  # (numel,) each
        self.where = {}  # parameter -> (its bucket, where its gradient starts in the bucket)
        for b, bucket in enumerate(self.buckets):
            start = 0
            for p in bucket:
                self.where[p] = (b, start)
                start += p.numel()
        self.arrived = [0] * len(self.buckets)  # gradients copied into each bucket this step
        self.handles = []  # (bucket index, handle of its all-reduce), in launch order
        for p in params:
            p.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param):
        """Hook: ``param.grad`` is final for this backward."""
        b, start = self.where[param]
        self.flat[b][start:start + param.numel()].copy_(param.grad.reshape(-1))
        self.arrived[b] += 1
        if self.arrived[b] == len(self.buckets[b]):  # the bucket is full: send it now
            handle = dist.all_reduce(self.flat[b], group=self.group, async_op=True)  # no wait
            self.handles.append((b, handle))

    def finish(self):
        """After ``loss.backward()``: every ``.grad`` becomes the mean over the ranks."""
        for b, _handle in self.handles:
            self.flat[b].div_(self.world_size)  # the sum / N: the mean
            for p in self.buckets[b]:
                start = self.where[p][1]
                p.grad.copy_(self.flat[b][start:start + p.numel()].view(p.shape))
        for _b, handle in self.handles:
            handle.wait()
        self.handles, self.arrived = [], [0] * len(self.buckets)  # ready for the next step


if __name__ == "__main__":  # torchrun --nproc-per-node 3 workspace/my_hooks.py
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    gpus = torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("nccl" if gpus else "gloo")  # torchrun set the rest
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpus else torch.device("cpu")
    torch.manual_seed(0)  # the same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 2)).to(device)
    reference = DDP(copy.deepcopy(model), device_ids=[device.index] if gpus else None)
    hooks = BucketHooks(model, bucket_cap_mb=0.01)  # 10 kB: a few buckets
    torch.manual_seed(1 + rank)  # each rank its own batch
    x, y = torch.randn(16, 8, device=device), torch.randint(0, 2, (16,), device=device)
    F.cross_entropy(model(x), y).backward()
    hooks.finish()
    F.cross_entropy(reference(x), y).backward()
    same = all(torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
               for p, q in zip(model.parameters(), reference.module.parameters(), strict=True))
    print(f"rank {rank}: {len(hooks.buckets)} buckets, gradients == DDP's: {same}")
    dist.destroy_process_group()
