"""Exercise 6.3, the ring all-reduce: ``ring_all_reduce(tensor, group=None)`` in the learner's
file, in place, the SUM, from point-to-point messages, on 2, 3 and 4 processes.

Rank side: each case gives every rank its own tensor and calls the learner's function on it;
``dist.all_reduce`` of the same inputs (run first, outside the tracer) is the answer. Inputs are
whole numbers from 1 to 99, so every sum is exact in any order and a wrong answer can be
matched exactly against what a known mistake would produce (``ring_mistakes``). The other cases
pass ``group=None``; a last one passes a group: of rank 0 alone on 2 processes, of ranks [1, 2]
or [1, 3] on 3 and 4, where a peer named by its global rank (``dst=``, not ``group_dst=``) is
not the one meant.

Kernel side: the judge refuses a collective or an open handle, compares the caller's tensor
with the sum (naming a known mistake from its numbers), and checks the bytes each rank sent:
2(N-1)/N of the tensor, give or take one chunk.
"""

from __future__ import annotations

import ast

import torch
import torch.distributed as dist

from course_lib.check.cases import expect_waited, members, passed, ring_share, with_group_case
from course_lib.check.cases.ring_mistakes import REFUSED, mistake_hint, name_mistake
from course_lib.check.checker import expect
from course_lib.check.mp.harness import FileExercise
from course_lib.check.mp.tracer import Tracer
from course_lib.check.mp.verdict import Advice, is_shape_error


def case_specs(world_size: int, options: dict) -> list[dict]:
    n = world_size
    few = max(1, n - 1)
    specs = [  # (name, shape, dtype, transposed)
        ("12 float32 numbers", [12], "float32", False),
        ("11 float64 numbers (not a multiple of N)", [11], "float64", False),
        (f"{few} float32 number{'s' if few > 1 else ''}, fewer than the {n} ranks", [few],
         "float32", False),
        ("a 0-d float64 tensor", [], "float64", False),
        ("an int64 tensor of shape (2, 5)", [2, 5], "int64", False),
        ("a transposed (non-contiguous) float32 view of shape (3, 4)", [4, 3], "float32",
         True),
    ]
    specs = [{"name": name, "shape": shape, "dtype": dtype, "transposed": transposed}
             for name, shape, dtype, transposed in specs]
    if n == 2:
        specs.append({"name": "5 float32 numbers, in a group of 1 process", "shape": [5],
                      "dtype": "float32", "transposed": False, "members": [0]})
    return with_group_case(specs, n, {"name": "5 float32 numbers", "shape": [5],
                                      "dtype": "float32", "transposed": False})


def make_input(spec: dict, rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor in case ``spec`` (a transposed view where the case says so)."""
    g = torch.Generator().manual_seed(1000 * spec["seed"] + rank)
    values = torch.randint(1, 100, spec["shape"], generator=g).to(getattr(torch, spec["dtype"]))
    return values.t() if spec["transposed"] else values


def flat_list(tensor: torch.Tensor) -> list:
    return tensor.detach().flatten().tolist()  # in the order of the logical shape


def run_case(learner, spec: dict, group: dist.ProcessGroup, tracer: Tracer, options: dict) -> dict:
    tensor = make_input(spec, dist.get_rank(group))
    before = tensor.clone()
    expected = before.clone()
    dist.all_reduce(expected, group=group)  # the answer, before the tracer watches
    with tracer.watching(spec["name"], members(spec)) as log:
        returned = learner.ring_all_reduce(tensor, passed(spec, group))
        got = flat_list(tensor)  # what the caller's tensor holds when the function returns
    other = isinstance(returned, torch.Tensor) and returned is not tensor
    return {"input": flat_list(before), "expected": flat_list(expected), "got": got,
            "numel": tensor.numel(), "element_size": tensor.element_size(),
            "returned_other": flat_list(returned) if other else None, **log.summary()}


# ---- the judge (in the kernel) --------------------------------------------------------------

YOURSELF = "the point is to write the ring yourself, from dist.isend and dist.irecv"


def explain(error: dict, text: str) -> str:
    if "out of range" in error["message"] and ".chunk(" in text:
        return ("torch.chunk can return fewer than N chunks (2 numbers in 3 chunks gives 2), "
                "but the ring needs N chunks on every rank, some of them empty.")
    if "has to be contiguous" in error["message"]:
        return ("isend and irecv take a tensor whose values lie in one run of memory: a view "
                "of another shape (a transpose, a slice of columns) and its clone keep their "
                "strides; .contiguous() gives such a tensor, to copy back afterwards.")
    if is_shape_error(error["message"]):
        return ("Two chunks of different sizes met: every rank must cut the tensor into the "
                "same N chunks, and add what arrives into the chunk the sender sent.")
    return ""


def judge_calls(rank: int, s: dict) -> None:
    """No library all-reduce, no collective: the ring is made of point-to-point messages."""
    used = [*(f"the library's {f}" for f in s["library"]),
            *(f"dist.{c}" for c in s["collectives"])]
    expect(not used, f"ring_all_reduce calls {(used or [''])[0]}: {YOURSELF}")
    blocking = sorted({"send", "recv"} & set(s["calls"]))
    expect(not blocking, f"ring_all_reduce calls dist.{(blocking or [''])[0]}, which blocks: "
                         "the exercise builds the ring from dist.isend and dist.irecv, so that "
                         "each step's send and receive are under way together")
    expect_waited(rank, s, "until its handle is waited on, a message may not have arrived "
                           "(or left) yet")


def _values(by_rank: dict, key: str, n: int) -> list[torch.Tensor]:
    return [torch.tensor(by_rank[r][key], dtype=torch.float64) for r in range(n)]


def _unchanged(spec: dict, by_rank: dict, rank: int) -> None:
    """The caller's tensor came back as it went in, on every rank: say why."""
    expect(not spec["transposed"],
           "a non-contiguous tensor came back unchanged: flattening it (reshape, flatten or "
           "contiguous) made a copy, and the sum stayed in that copy; ring_all_reduce works "
           "in place, on the tensor it is given")
    other = by_rank[rank]["returned_other"]
    expect(other is None or other != by_rank[rank]["expected"],
           "the sum is in the tensor you returned, not in the caller's tensor: "
           "ring_all_reduce works in place, on the tensor it is given")
    expect(False, "the caller's tensor is unchanged on every rank: ring_all_reduce must "
                  "leave the sum in the tensor it is given, in place")


def _short(values: torch.Tensor) -> str:
    shown = [int(v) if float(v).is_integer() else round(float(v), 3) for v in values[:6]]
    return str(shown)[:-1] + (", ...]" if values.numel() > 6 else "]")


def judge_values(spec: dict, by_rank: dict, n: int, path: str = "") -> None:
    """The sum on every rank, in the caller's tensor; a wrong one named by its mistake (the
    learner's file at ``path`` may say why the chunks kept their own numbers)."""
    inputs, got = _values(by_rank, "input", n), _values(by_rank, "got", n)
    expected = _values(by_rank, "expected", n)
    wrong = [r for r in range(n) if not torch.equal(got[r], expected[r])]
    if not wrong:
        return
    if all(torch.equal(g, x) for g, x in zip(got, inputs, strict=True)):
        _unchanged(spec, by_rank, wrong[0])
    mistake = name_mistake(inputs, got)
    rebinding = rebound_sum(path) if mistake == ("overwrite",) and path else None
    expect(rebinding is None, rebinding or "")
    if mistake:
        expect(False, mistake_hint(mistake, n))
    r = wrong[0]
    i = int(torch.nonzero(got[r] != expected[r])[0])  # the first number that differs
    expect(False, f"rank {r} first differs from dist.all_reduce at number {i} of "
                  f"{got[r].numel()}: from there it holds {_short(got[r][i:])}, "
                  f"dist.all_reduce gives {_short(expected[r][i:])}, and no mistake the "
                  "checker knows gives these numbers: follow one chunk through the ring, which "
                  "rank sends it in each step and into which chunk the receiver adds (or "
                  "stores) it")


def judge_bytes(by_rank: dict, n: int) -> None:
    """Each rank sends 2(N-1)/N of the tensor, give or take one chunk, however it is cut."""
    found = ring_share([by_rank[r]["bytes_sent"] for r in range(n)], by_rank[0]["numel"],
                       by_rank[0]["element_size"], phases=2)
    expect(found is None, found or "")


def rebound_sum(path: str) -> str | None:
    """A line of ``ring_all_reduce`` that makes a new tensor of a name plus something (``x =
    x + y``), where the chunk was meant to change in place: the sentence that says so."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return None
    ring = next((node for node in tree.body if isinstance(node, ast.FunctionDef)
                 and node.name == "ring_all_reduce"), None)
    for node in ast.walk(ring) if ring else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and _adds_to(node.value,
                                                                       node.targets[0].id)):
            return (f"each chunk of the result is one rank's own numbers, not a sum: "
                    f"`{ast.unparse(node)}` (line {node.lineno}) makes a new tensor and binds "
                    "the name to it, so the chunk inside the tensor never changes; add in "
                    "place (+= or add_) into the tensor's own chunk")
    return None


def _adds_to(value: ast.expr, name: str) -> bool:
    """Whether ``value`` is ``name + something`` or ``something + name`` (not a number)."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return False
    sides = (value.left, value.right)
    return (any(isinstance(v, ast.Name) and v.id == name for v in sides)
            and not any(isinstance(v, ast.Constant) for v in sides))


def judge(spec: dict, by_rank: dict, run) -> None:
    n = len(by_rank)
    for rank in range(n):
        judge_calls(rank, by_rank[rank])
    judge_values(spec, by_rank, n, run.path)
    judge_bytes(by_rank, n)


EXERCISE = FileExercise(
    "6.3", "workspace/my_ring.py", ("ring_all_reduce",), __name__, Advice(
        all_send="In a ring every rank sends and receives in each step, so each rank's receive "
                 "must already be under way while it waits for its send to complete.",
        all_recv="In a ring every rank sends and receives in each step, so each rank's send "
                 "must already be under way while it waits for its receive.",
        mismatch="Both ends of each message must agree: in every step each rank sends to its "
                 "right-hand neighbour and receives from its left-hand one.",
        size="A receive buffer must match its message: either the two ranks meant different "
             "chunks (or cut the tensor differently), or the buffer has another dtype than the "
             "tensor (torch.empty and torch.zeros make float32 unless told otherwise)."),
    judge, library=dict.fromkeys(REFUSED, YOURSELF), explain=explain,
    entry="check.nb06.my_ring")
