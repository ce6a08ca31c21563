"""Where training memory goes: parameters, gradients, optimizer state, activations (notebook 02).

    from course_lib.lessons.memory import memory_breakdown, activation_bytes
    activation_bytes(model, x, y)       # bytes kept alive between forward and backward
    memory_breakdown(model, optimizer, x, y)   # {"parameters": ..., "gradients": ..., ...}

Activations are *measured*. On CPU (or with ``method="hooks"``) we count every tensor autograd
saves for backward with ``torch.autograd.graph.saved_tensors_hooks``, each storage once (a view
and its base share one), leaving out the parameters (already counted). On a GPU the default is
``torch.cuda.max_memory_allocated``: the peak the allocator saw during the forward pass.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's elements: numel x bytes per element."""
    return t.numel() * t.element_size()


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of all parameters."""
    return sum(tensor_bytes(p) for p in model.parameters())


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the ``.grad`` tensors that exist now (one per parameter after backward)."""
    return sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor the optimizer keeps (momentum, Adam's two moments, step counters).

    The state is created lazily, at the first ``optimizer.step()``.
    """
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and storage_key(value) not in seen:
                seen.add(storage_key(value))
                total += value.untyped_storage().nbytes()
    return total


def storage_key(t: torch.Tensor) -> tuple:
    """What tells two tensors' storages apart: (device, index, address, bytes)."""
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr(), storage.nbytes())


def saved_tensors(run_forward: Callable[[], torch.Tensor],
                  exclude: Iterable[torch.Tensor] = ()) -> list[dict]:
    """What autograd saves for backward while ``run_forward()`` runs: one entry per storage.

    Each entry: ``shape`` and ``dtype`` of the first tensor seen on that storage, and ``bytes``
    of the whole storage (a view keeps all of it alive). Storages of ``exclude`` (the
    parameters, counted elsewhere) are left out.
    """
    skip = {storage_key(t) for t in exclude}
    found: dict[tuple, dict] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in skip and key not in found:
            found[key] = {"shape": tuple(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                          "bytes": key[3]}
        return t  # keep the tensor itself: we only look

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run_forward()
    del loss  # frees the graph and everything it saved
    return list(found.values())


def saved_tensor_bytes(run_forward: Callable[[], torch.Tensor],
                       exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the storages autograd saves for backward, each counted once."""
    return sum(entry["bytes"] for entry in saved_tensors(run_forward, exclude))


def cuda_peak_bytes(run_forward: Callable[[], torch.Tensor], device: torch.device) -> int:
    """Peak bytes the CUDA allocator held above its starting point while ``run_forward()`` ran."""
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    loss = run_forward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del loss
    return peak - start


def activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     loss_fn: Callable = F.cross_entropy, method: str = "auto") -> int:
    """Activation memory of one forward pass (to the loss) on the batch ``x``, ``y``.

    ``method``: ``"hooks"`` (saved tensors, any device), ``"cuda"`` (allocator peak, GPU only)
    or ``"auto"`` (cuda on a GPU, hooks otherwise).
    """
    if method == "auto":
        method = "cuda" if x.is_cuda else "hooks"
    run_forward = lambda: loss_fn(model(x), y)
    if method == "hooks":
        return saved_tensor_bytes(run_forward, exclude=list(model.parameters()))
    if method == "cuda":
        if not x.is_cuda:
            raise ValueError("method='cuda' needs the batch on a GPU; use method='hooks' on CPU")
        return cuda_peak_bytes(run_forward, x.device)
    raise ValueError(f"method={method!r} is not known; use 'auto', 'hooks' or 'cuda'")


def memory_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                     y: torch.Tensor, loss_fn: Callable = F.cross_entropy) -> dict[str, int]:
    """Bytes of each kind of training memory for one step on ``x``, ``y``.

    Runs one real training step first (so that gradients and the optimizer state exist),
    then measures activations of a fresh forward pass.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    optimizer.step()
    return {"parameters": parameter_bytes(model), "gradients": gradient_bytes(model),
            "optimizer state": optimizer_state_bytes(optimizer),
            "activations": activation_bytes(model, x, y, loss_fn)}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line ys ~ slope * xs + intercept; also the largest relative residual."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((a - mean_x) ** 2 for a in xs)
    slope = sum((a - mean_x) * (b - mean_y) for a, b in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    worst = max(abs(b - (slope * a + intercept)) / abs(b) for a, b in zip(xs, ys, strict=True))
    return slope, intercept, worst


def largest_batch_that_fits(budget_bytes: float, fixed_bytes: float,
                            bytes_per_example: float) -> int:
    """The largest batch whose fixed plus activation memory stays within the budget (0: none)."""
    if bytes_per_example <= 0:
        raise ValueError("bytes_per_example must be positive")
    room = budget_bytes - fixed_bytes  # what is left for activations
    return max(0, math.floor(room / bytes_per_example))


def accumulation_steps_needed(global_batch: int, largest_micro_batch: int) -> int:
    """How many micro-steps a global batch needs when a micro-batch holds at most that many."""
    if largest_micro_batch < 1:
        raise ValueError("not even one example fits: lower the fixed memory or raise the budget")
    return math.ceil(global_batch / largest_micro_batch)  # round up: the last one may be short


def group_sizes(world_size: int) -> list[int]:
    """The group sizes a memory demo measures at: 1, 2, 4, ... below ``world_size``, then
    ``world_size`` itself (per-rank memory against N)."""
    sizes, n = [], 1
    while n < world_size:
        sizes.append(n)
        n *= 2
    return sizes + [world_size]
