"""What every hand-written collective does before it moves data (notebook 06).

``course_lib.collectives`` builds all-reduce from point-to-point messages. A rank that passes a
tensor of another shape or dtype would make the others wait for bytes that never come, or add
mismatched halves. So before the data moves, every rank sends a tiny *signature*
``[dtype code, ndim, shape...]`` to rank 0; rank 0 compares them and answers each rank with
"all the same" or with the table of every rank's signature, and then every rank raises the
same ``ValueError``. These messages are not counted in a ``ByteCounter``: they are a safety
check of a few dozen bytes, not part of the algorithm whose cost the counter measures.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# dtype <-> small integer, so that a signature is a plain int64 tensor
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)
INLINE_DIMS = 8  # dims sent in the first message; more (rare) follow in a second one
HEADER_LEN = 2 + INLINE_DIMS  # [dtype code, ndim, shape[0], ..., shape[7]] (zero padded)


def resolve_group(group: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup, int, int]:
    """The group (the default one for None), this rank's index in it and its size."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("no process group: call these functions inside "
                           "`with course_lib.worker.worker() as w:` in a launched module")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group it was given; pass a "
                         "group that contains it (or group=None for every process)")
    return group, rank, dist.get_world_size(group)


def check_tensor(tensor: torch.Tensor, name: str) -> None:
    """A clear error for inputs that no collective here can handle."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise ValueError(f"{name} does not support dtype {tensor.dtype}; convert the tensor to "
                         f"one of: {names}")
    if tensor.is_sparse:
        raise ValueError(f"{name} needs a dense tensor; call .to_dense() first")


def signature(tensor: torch.Tensor) -> list[int]:
    """``[dtype code, ndim, *shape]``: what must agree on every rank."""
    return [DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape]


def describe(sig: list[int]) -> str:
    shape = tuple(sig[2:])
    return f"shape {shape} and dtype {DTYPES[sig[0]]}"


def check_same_signature(tensor: torch.Tensor, group: dist.ProcessGroup, rank: int,
                         world_size: int, name: str) -> None:
    """Raise the same ``ValueError`` on every rank unless all ranks pass alike tensors."""
    mine = signature(tensor)
    device = tensor.device  # NCCL moves only GPU tensors: the signature lives where the data is
    if rank == 0:
        table = [mine] + [_receive_signature(src, group, device) for src in range(1, world_size)]
        verdict = [] if all(sig == mine for sig in table) else _flatten(table)
        _send_verdict(verdict, group, world_size, device)
    else:
        _send_signature(mine, group, device)
        verdict = _receive_verdict(group, device)
    if verdict:
        raise ValueError(_mismatch_message(_unflatten(verdict), name))


def _send_signature(sig: list[int], group, device) -> None:
    header = sig[:HEADER_LEN] + [0] * (HEADER_LEN - min(len(sig), HEADER_LEN))
    works = [dist.isend(torch.tensor(header, device=device), group=group, group_dst=0)]
    if len(sig) > HEADER_LEN:  # a tensor with more than INLINE_DIMS dims: the rest follows
        works.append(dist.isend(torch.tensor(sig[HEADER_LEN:], device=device), group=group,
                                group_dst=0))
    for work in works:
        work.wait()


def _receive_signature(src: int, group, device) -> list[int]:
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=device)
    dist.recv(header, group=group, group_src=src)
    code, ndim, *dims = header.tolist()
    if ndim > INLINE_DIMS:
        rest = torch.empty(ndim - INLINE_DIMS, dtype=torch.int64, device=device)
        dist.recv(rest, group=group, group_src=src)
        dims += rest.tolist()
    return [code, ndim, *dims[:ndim]]


def _send_verdict(verdict: list[int], group, world_size: int, device) -> None:
    """To every rank: the length of the table (0 when all agree), then the table itself."""
    length = torch.tensor([len(verdict)], device=device)
    table = torch.tensor(verdict, dtype=torch.int64, device=device)
    works = []
    for dst in range(1, world_size):
        works.append(dist.isend(length, group=group, group_dst=dst))
        if verdict:
            works.append(dist.isend(table, group=group, group_dst=dst))
    for work in works:
        work.wait()


def _receive_verdict(group, device) -> list[int]:
    length = torch.empty(1, dtype=torch.int64, device=device)
    dist.recv(length, group=group, group_src=0)
    if length.item() == 0:
        return []
    table = torch.empty(int(length.item()), dtype=torch.int64, device=device)
    dist.recv(table, group=group, group_src=0)
    return table.tolist()


def _flatten(table: list[list[int]]) -> list[int]:
    """[[code, ndim, *shape] per rank] -> one list, each signature in turn."""
    return [value for sig in table for value in sig]


def _unflatten(flat: list[int]) -> list[list[int]]:
    table, i = [], 0
    while i < len(flat):
        ndim = flat[i + 1]
        table.append(flat[i:i + 2 + ndim])
        i += 2 + ndim
    return table


def _mismatch_message(table: list[list[int]], name: str) -> str:
    odd = [r for r, sig in enumerate(table) if sig != table[0]]
    shown = "; ".join(f"rank {r} has {describe(table[r])}" for r in odd[:3])
    more = f" (and {len(odd) - 3} more ranks)" if len(odd) > 3 else ""
    return (f"{name}: the ranks passed different tensors: rank 0 has {describe(table[0])}; "
            f"{shown}{more}. Every rank must pass a tensor of the same shape and dtype.")
