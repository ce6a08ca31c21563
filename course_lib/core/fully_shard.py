"""ZeRO stage 3, fully sharded data parallel, shaped like PyTorch's FSDP2 (notebook 10).

    for block in model.blocks:
        fully_shard(block)         # each block's parameters: one flat shard per rank
    fully_shard(model)             # the root: what is left (embeddings, head, a tied weight)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)    # model.parameters(): shards
    loss_fn(model(x), y).backward(); model.finish_gradient_sync(); optimizer.step()

One wrapped module in one step (flat_shard.py keeps its numbers):
    forward pre-hook    all-gather its parameters; they become views of one ``full`` tensor
    forward post-hook   free them (reshard_after_forward=True); hook the outputs' gradients
    an output's grad    its backward is next: all-gather again, if freed (once per use)
    full's gradient     complete, every use in: reduce-scatter, keep my shard's mean, free

Parameters, gradients and optimizer state take 1/N of their size per rank, and only the modules
computing now are whole; the price is the all-gather before backward: 1.5x the bytes of plain
data parallelism. ``mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: gather,
compute and reduce in bf16; the shards, their gradients and the optimizer stay fp32.

As in FSDP2: wrap sub-modules first, the root last; a module manages the parameters no wrapped
sub-module has (a tied weight: wrap a module whose forward holds every use, usually the root);
all ranks start from the same weights and use the same wrapped modules (the collectives must
match). Unlike FSDP2: one flat shard per module (``full_state_dict(model)`` gives parameters by
name), the root too is freed after forward (FSDP2 keeps it: ``reshard_after_forward=False``),
each collective blocks. ``finish_gradient_sync()`` has only parameters outside every wrapped
module to average (replicated, as in plain data parallelism), if any: every shard's gradient
was reduce-scattered in backward. Call it once per optimizer step, after the last backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from course_lib.core.collectives import ring_all_reduce
from course_lib.core.flat_shard import FlatShard, parameter_places
from course_lib.core.messages import ByteCounter


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """The dtypes of compute and communication (torch's policy of the same name works too)."""

    param_dtype: torch.dtype | None = None  # gather and compute in it; None: the shard's
    reduce_dtype: torch.dtype | None = None  # reduce gradients in it; None: param_dtype
    output_dtype: torch.dtype | None = None  # cast a tensor output to it; None: leave it
    cast_forward_inputs: bool = True  # floating-point inputs to param_dtype


def fully_shard(module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """Shard ``module``'s parameters over the ranks of ``process_group``; returns ``module``."""
    return shard_module(module, FlatShard, process_group, reshard_after_forward, mp_policy)


def shard_module(module: nn.Module, shard_class: type[FlatShard],
                 process_group: dist.ProcessGroup | None, reshard_after_forward: bool,
                 mp_policy) -> nn.Module:
    """A ``shard_class`` (prefetch.py passes its own) and the hooks for ``module``. A module
    with no parameters of its own (a root over wrapped blocks) gets the methods only."""
    if hasattr(module, "shard_state"):
        raise ValueError(f"this {type(module).__name__} is wrapped already: wrap it once")
    policy = mp_policy or MixedPrecisionPolicy()
    state = None
    if parameter_places(module):
        state = shard_class(module, process_group, policy.param_dtype, policy.reduce_dtype)
        module.register_parameter("flat_shard", state.shard)
        module.shard_state = state
        module.register_forward_pre_hook(partial(before_forward, state, policy),
                                         with_kwargs=True)
        module.register_forward_hook(partial(after_forward, state, reshard_after_forward,
                                             policy))
    module.finish_gradient_sync = partial(  # as the course's other wrappers have it
        finish_gradient_sync, module, process_group, state.counter if state else None)
    module.full_state_dict = partial(full_state_dict, module)
    return module


def before_forward(state: FlatShard, policy, module, args, kwargs):
    """Gather the parameters; cast floating-point inputs to param_dtype."""
    state.before_forward()
    if policy.param_dtype is not None and policy.cast_forward_inputs:
        args = tuple(cast(a, policy.param_dtype) for a in args)
        kwargs = {k: cast(v, policy.param_dtype) for k, v in kwargs.items()}
    return args, kwargs


def after_forward(state: FlatShard, reshard: bool, policy, module, args, output):
    """Free the parameters; gather them again when the first output gradient comes."""
    state.after_forward(reshard)
    for tensor in tensors_in(output):
        if tensor.requires_grad:
            tensor.register_hook(partial(before_backward, state))
    return cast(output, policy.output_dtype) if policy.output_dtype else output


def before_backward(state: FlatShard, grad: torch.Tensor) -> None:
    """Hook on an output: the module's backward is next. Returns None: ``grad`` unchanged."""
    state.before_backward()


def cast(value, dtype: torch.dtype):
    return value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value


def tensors_in(output) -> list[torch.Tensor]:
    """The tensors of a forward's output: a tensor, or inside tuples, lists and dicts."""
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in tensors_in(item)]
    return [output] if torch.is_tensor(output) else []


def is_shard(param: torch.Tensor) -> bool:
    return getattr(param, "is_flat_shard", False)


def finish_gradient_sync(model: nn.Module, process_group: dist.ProcessGroup | None = None,
                         counter: ByteCounter | None = None) -> None:
    """After the last backward of a step: average the gradients of the parameters outside
    every wrapped module over the ranks (the shards' were reduce-scattered in backward)."""
    for param in model.parameters():
        if not is_shard(param) and param.grad is not None:
            ring_all_reduce(param.grad, process_group, counter)  # the sum, every rank
            param.grad.div_(dist.get_world_size(process_group))  # the mean


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter at full size, by its name before wrapping (a tied weight under its
    first name, as ``named_parameters`` gives it). A collective: call it on every rank."""
    params = {}
    for prefix, module in model.named_modules():
        if hasattr(module, "shard_state"):
            for name, tensor in module.shard_state.full_params().items():
                params[f"{prefix}.{name}" if prefix else name] = tensor
    for name, param in model.named_parameters():
        if not is_shard(param):
            params[name] = param.detach().clone()  # replicated: every rank has it whole
    return params


def bytes_sent(model: nn.Module) -> int:
    """What this rank sent for the wrapped modules of ``model`` so far (their counters)."""
    return sum(m.shard_state.counter.bytes_sent for m in model.modules()
               if hasattr(m, "shard_state"))
