"""ZeRO stage 3, fully sharded data parallel, shaped like PyTorch's FSDP2 (notebook 10b).

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

As FSDP2 does, ``fully_shard`` swaps the module's class for ``Sharded<Class>``, a subclass of
``ShardedModule`` and of its own class, so ``isinstance(block, ShardedModule)`` holds and these
are methods:

    block.unshard() / block.reshard()           gather this module's parameters now / free them
    model.set_requires_gradient_sync(False)     accumulate micro-steps without reduce-scatters
    model.finish_gradient_sync()                average the parameters outside every wrapped
                                                module (the course's; call it once per step)
    model.full_state_dict()                     every parameter at full size, by name

As in FSDP2: wrap sub-modules first, the root last; a module manages the parameters no wrapped
sub-module has (a tied weight: wrap a module whose forward holds every use, usually the root);
all ranks start from the same weights and use the same wrapped modules (the collectives must
match); change the model (dtype, device, requires_grad) before wrapping it: the next forward
refuses a change. How torch's ``fully_shard`` (FSDP2) differs from this, FSDP1's simpler design:

    what                       here                               FSDP2
    a module's parameters      one flat vector, N equal pieces    each parameter cut along dim 0
    model.parameters()         one flat_shard per module          the original names (DTensors)
    the root after forward     freed, as every module             kept whole until its backward
    collectives                block (prefetch.py: gather early)  on their own streams
    gradients reduced in       param_dtype (another: refused)     reduce_dtype
    sync off: full gradient    kept in param_dtype                kept in reduce_dtype
    a parameter no rank uses   zeros in its shard's gradient      no gradient (None)
    model.to(...) afterwards   refused at the next forward        re-shards the new tensors
    parameters left outside    finish_gradient_sync() averages    fully_shard(root) takes them
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
from course_lib.core.model_change import changed_after_wrapping, layout_of, what_changed
from course_lib.core.outputs import tensors_in, unseen_objects


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """The dtypes of compute and communication (torch's policy of the same name works too)."""

    param_dtype: torch.dtype | None = None  # gather and compute in it; None: the shard's
    reduce_dtype: torch.dtype | None = None  # None or param_dtype: gradients reduce in it
    output_dtype: torch.dtype | None = None  # cast a tensor output to it; None: leave it
    cast_forward_inputs: bool = True  # floating-point inputs to param_dtype


class ShardedModule:
    """What ``fully_shard`` adds to a module, as FSDP2's ``FSDPModule``: its methods."""

    def __new__(cls, *args, **kwargs):
        """A new module of a sharded class (``nn.Sequential`` slicing makes one) is a plain
        one of the original class, as in FSDP2."""
        original = cls.__mro__[2]  # [Sharded<Class>, ShardedModule, Class, ...]
        module = original.__new__(original, *args, **kwargs)
        module.__init__(*args, **kwargs)
        return module

    def unshard(self, async_op: bool = False) -> dist.Work | None:
        """Gather this module's parameters now (not its sub-modules'). With ``async_op``,
        return the all-gather's handle; the module's next forward waits for it."""
        state = getattr(self, "shard_state", None)
        if state is None:
            return None
        state.wait_for_unshard()
        work = state.unshard(async_op=async_op)
        state.install_views()  # the module's attributes: views of full
        state.pending = work if async_op else None
        return work

    def reshard(self) -> None:
        """Free this module's gathered parameters (its attributes keep views of no memory)."""
        if getattr(self, "shard_state", None) is not None:
            self.shard_state.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *,
                                   recurse: bool = True) -> None:
        """False: backward keeps each module's full gradient, adding micro-step to micro-step,
        and sends nothing; True again before the last micro-step's backward, which reduces
        the sum. ``recurse``: for every wrapped module under this one too."""
        for module in self.modules() if recurse else [self]:
            if getattr(module, "shard_state", None) is not None:
                module.shard_state.requires_gradient_sync = requires_gradient_sync

    def finish_gradient_sync(self) -> None:
        """After the last backward of a step: average the parameters outside every wrapped
        module. Refuses a step whose last backward ran with gradient sync off."""
        for name, module in self.named_modules():
            state = getattr(module, "shard_state", None)
            if state is not None and state.full.grad is not None:
                raise RuntimeError(
                    f"{name or 'the root'} ({type(module).__name__.removeprefix('Sharded')}) "
                    "holds gradients that were never reduce-scattered: the last backward ran "
                    "with gradient sync off. Call set_requires_gradient_sync(True) before the "
                    "last micro-step's backward, as with FSDP2")
        finish_gradient_sync(self, self.shard_group, self.shard_counter)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return full_state_dict(self)

    def __deepcopy__(self, memo):
        raise TypeError("a sharded module cannot be deep-copied (as in FSDP2): copy the model "
                        "before fully_shard, or save full_state_dict()")


SHARDED_CLASSES: dict[type, type] = {}  # a class -> its Sharded<Class>, made once


def fully_shard(module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """Shard ``module``'s parameters over the ranks of ``process_group``; returns ``module``."""
    return shard_module(module, FlatShard, process_group, reshard_after_forward, mp_policy)


def shard_module(module: nn.Module, shard_class: type[FlatShard],
                 process_group: dist.ProcessGroup | None, reshard_after_forward: bool,
                 mp_policy) -> nn.Module:
    """A ``shard_class`` (prefetch.py passes its own) and the hooks for ``module``. A module
    with no parameters of its own (a root over wrapped blocks) gets the methods only."""
    if isinstance(module, ShardedModule):
        raise ValueError(f"this {type(module).__name__} is wrapped already: wrap it once")
    policy = mp_policy or MixedPrecisionPolicy()
    state = None
    if parameter_places(module):
        state = shard_class(module, process_group, policy.param_dtype, policy.reduce_dtype)
        module.register_parameter("flat_shard", state.shard)
        module.shard_state = state
        names = [name for _, where in state.places for _, _, name in where]
        what = f"{type(module).__name__} ({', '.join(names)})"  # in its errors
        layout = layout_of(module.named_parameters(recurse=False))  # the flat shard, as made
        module.register_forward_pre_hook(partial(before_forward, state, policy, what, layout),
                                         with_kwargs=True)
        module.register_forward_hook(partial(after_forward, state, reshard_after_forward,
                                             policy, what))
    module.shard_group = process_group  # for finish_gradient_sync's all-reduces
    module.shard_counter = state.counter if state else None
    cls = type(module)
    if cls not in SHARDED_CLASSES:
        SHARDED_CLASSES[cls] = type(f"Sharded{cls.__name__}", (ShardedModule, cls), {})
    module.__class__ = SHARDED_CLASSES[cls]
    return module


def before_forward(state: FlatShard, policy, what: str, layout: list, module, args, kwargs):
    """Refuse a model changed since wrapping; gather the parameters; cast floating-point
    inputs to param_dtype. ``what``: the module's class and parameters, for errors."""
    change = what_changed(layout, module.named_parameters(recurse=False))
    if change:
        raise changed_after_wrapping(f"fully_shard, {what}", change)
    state.before_forward()
    if policy.param_dtype is not None and policy.cast_forward_inputs:
        args = tuple(cast(a, policy.param_dtype) for a in args)
        kwargs = {k: cast(v, policy.param_dtype) for k, v in kwargs.items()}
    return args, kwargs


def after_forward(state: FlatShard, reshard: bool, policy, what: str, module, args, output):
    """Free the parameters; gather them again when the first output gradient comes."""
    state.after_forward(reshard)
    tensors = [t for t in tensors_in(output) if t.requires_grad]
    hidden = unseen_objects(output)
    if not tensors and hidden and state.shard.requires_grad and torch.is_grad_enabled():
        raise TypeError(f"fully_shard: the forward of {what} returned "
                        f"{', '.join(hidden)}, in which no tensor can be found, so nothing "
                        "would gather its parameters again before its backward. Return the "
                        "tensors in a tuple, list, dict or dataclass (where torch DDP looks)")
    for tensor in tensors:
        tensor.register_hook(partial(before_backward, state))
    return cast(output, policy.output_dtype) if policy.output_dtype else output


def before_backward(state: FlatShard, grad: torch.Tensor) -> None:
    """Hook on an output: the module's backward is next. Returns None: ``grad`` unchanged."""
    state.before_backward()


def cast(value, dtype: torch.dtype):
    return value.to(dtype) if torch.is_tensor(value) and value.is_floating_point() else value


def is_shard(param: torch.Tensor) -> bool:
    return getattr(param, "is_flat_shard", False)


def finish_gradient_sync(model: nn.Module, process_group: dist.ProcessGroup | None = None,
                         counter: ByteCounter | None = None) -> None:
    """After the last backward of a step: average the gradients of the parameters outside
    every wrapped module over the ranks (the shards' were reduce-scattered in backward). Every
    rank joins every all-reduce: one that did not use a parameter sends zeros, and a count
    of the ranks that did rides in the same message, so that one no rank used keeps ``.grad``
    None, as it would in one process."""
    n = dist.get_world_size(process_group)
    for param in model.parameters():
        if is_shard(param) or not param.requires_grad:
            continue
        mine = param.grad if param.grad is not None else torch.zeros_like(param)
        used = torch.ones(1, dtype=mine.dtype, device=mine.device) * (param.grad is not None)
        message = torch.cat([mine.reshape(-1), used])  # (numel + 1,) my gradient, did I use it
        ring_all_reduce(message, process_group, counter)  # the sums, every rank
        if message[-1] > 0:  # some rank used it
            param.grad = message[:-1].view_as(param).div_(n)  # the mean


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter at full size, by its name before wrapping (a tied weight under its
    first name, as ``named_parameters`` gives it). A collective: call it on every rank."""
    params = {}
    for prefix, module in model.named_modules():
        if hasattr(module, "shard_state"):
            for name, tensor in full_params(module.shard_state).items():
                params[f"{prefix}.{name}" if prefix else name] = tensor
    for name, param in model.named_parameters():
        if not is_shard(param):
            params[name] = param.detach().clone()  # replicated: every rank has it whole
    return params


@torch.no_grad()
def full_params(state: FlatShard) -> dict[str, torch.Tensor]:
    """One wrapped module's parameters at full size in the shard's dtype (fp32: the master
    values, not the param_dtype copies), by name from that module. A collective."""
    full = torch.empty(state.world_size * state.shard_numel, dtype=state.shard.dtype,
                       device=state.shard.device)  # (N*s,)
    dist.all_gather_single(full, state.shard.detach(), group=state.process_group)
    pieces = full.split([*state.numels, state.padding])[:-1]  # the padding comes last
    return {where[0][2]: piece.view(shape).clone()
            for (_, where), piece, shape in zip(state.places, pieces, state.shapes, strict=True)}


def bytes_sent(model: nn.Module) -> int:
    """What this rank sent for the wrapped modules of ``model`` so far (their counters)."""
    return sum(m.shard_state.counter.bytes_sent for m in model.modules()
               if hasattr(m, "shard_state"))
