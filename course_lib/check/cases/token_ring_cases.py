"""The token ring's cases (exercises 5.3 and 5.4), run by ``course_lib.check.mp.program``.

Every rank passes its own token to the right; each case uses another shape and dtype. Tokens
are whole numbers, different on every rank (rank r's lie in 100 r + 1 .. 100 r + 99), so that
the checker can tell whose token a rank got back, and, when the function wrote into the
token it was given, whose token it holds now. On 2 processes a last case gives the function a
group of one process (rank 0 alone); a launch on 1 process runs every case that way.
``options["function"]`` names the function.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.check.mp.tracer import Tracer

CASES = (  # (name, shape, dtype)
    ("a float32 token of 3 numbers", [3], "float32"),
    ("an int64 token of shape (2, 2)", [2, 2], "int64"),
    ("a 0-d float64 token", [], "float64"),
)
ONE_PROCESS = ("a float32 token of 2 numbers, in a group of 1 process", [2], "float32")
NOT_CONNECTED = "Pair is not connected"  # Gloo, for an isend or irecv to the process itself


def case_specs(world_size: int, options: dict) -> list[dict]:
    specs = [{"name": name, "shape": shape, "dtype": dtype, "seed": i, "ranks": world_size}
             for i, (name, shape, dtype) in enumerate(CASES)]
    if world_size == 2:
        name, shape, dtype = ONE_PROCESS
        specs.append({"name": name, "shape": shape, "dtype": dtype, "seed": 9, "ranks": 1})
    return specs


def make_token(spec: dict, rank: int) -> torch.Tensor:
    """Rank ``rank``'s token in case ``spec``: the same on every process that makes it."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + rank)
    values = torch.randint(1, 100, spec["shape"], generator=g) + 100 * rank
    return values.to(getattr(torch, spec["dtype"]))


def describe_value(value, token: torch.Tensor) -> dict:
    """What the learner's function returned, as JSON."""
    if not isinstance(value, torch.Tensor):
        return {"tensor": False, "type": type(value).__name__}
    return {"tensor": True, "shape": list(value.shape), "dtype": str(value.dtype)[6:],
            "values": value.detach().flatten().tolist(), "is_token": value is token}


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    function = getattr(learner, options["function"])
    token = make_token(spec, dist.get_rank(group))
    before = token.clone()
    with tracer.watching(spec["name"], range(spec["ranks"])) as log:
        try:
            returned = describe_value(function(token, group), token)  # read before any wait
        except RuntimeError as error:
            if NOT_CONNECTED in str(error):  # Gloo's own words start with its C++ source line
                error.args = (f"{NOT_CONNECTED}: Gloo has no connection from a process to "
                              "itself",)
            raise
    changed = not torch.equal(token, before)
    return {"name": spec["name"], "ranks": spec["ranks"], "returned": returned,
            "token_changed": changed, "token_now": token.flatten().tolist() if changed else None,
            **log.summary()}
