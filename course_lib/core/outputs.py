"""Where the wrappers look for the tensors a forward returned (notebooks 08 and 10b).

``OverlapDataParallel(find_unused_parameters=True)`` follows their autograd graph to see which
parameters got no gradient; ``fully_shard`` hooks each one, to gather a module's parameters
again before its backward. Both look where torch DDP's ``_find_tensors`` looks: a tensor, or
inside lists, tuples (named ones too), dict values and dataclass fields, however nested.

    tensors_in({"logits": a, "aux": (b, [c, "text"])})   # [a, b, c]
    unseen_objects(Cache(k, v))                          # ["Cache"]: tensors it may hold
                                                         # are not found
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Iterator

import torch

PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def leaves(output) -> Iterator:
    """Everything in ``output`` that is not a list, tuple, dict or dataclass, in order."""
    if isinstance(output, dict):
        output = list(output.values())
    elif is_dataclass(output) and not isinstance(output, type):
        output = [getattr(output, f.name) for f in fields(output)]
    if isinstance(output, (list, tuple)) and not torch.is_tensor(output):
        for item in output:
            yield from leaves(item)
    else:
        yield output


def tensors_in(output) -> list[torch.Tensor]:
    """Every tensor in a forward's output, where torch DDP's ``_find_tensors`` finds them."""
    return [leaf for leaf in leaves(output) if torch.is_tensor(leaf)]


def unseen_objects(output) -> list[str]:
    """The type names of the objects in ``output`` the search cannot look inside (neither
    tensors nor plain values): a tensor they hold is not found."""
    return [type(leaf).__name__ for leaf in leaves(output)
            if not torch.is_tensor(leaf) and not isinstance(leaf, PLAIN)]
