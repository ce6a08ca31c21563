"""Helpers for checkers: call the learner's function, check the kind of value it returned.

    got = call(my_weights, [4, 4, 2])  # an error in my_weights shows the learner's line
    expect_type(got, (list, tuple), "return a list of weights, one per micro-batch")
    expect_tensor_with_grad(loss, "return the loss to call backward on")

Each raises ``ExerciseError`` (or ``LearnerCodeError``) with a message that says what was
expected and what came back, so a wrong kind of answer never crashes inside the checker.
"""

from __future__ import annotations

import os
import reprlib

import torch

from course_lib.check.checker import ExerciseError, LearnerCodeError, expect

_REPR = reprlib.Repr()
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = 6
_REPR.maxstring = _REPR.maxother = 40


def describe(value) -> str:
    """A few words on a value: ``None``, ``the float 0.5``, ``a tensor of shape (3,)``, ..."""
    if value is None:
        return "None (a function that ends without `return` gives None)"
    if isinstance(value, torch.Tensor):
        grad = " with a gradient path" if value.requires_grad else ""
        return f"a tensor of shape {tuple(value.shape)}{grad}"
    if isinstance(value, torch.nn.Module):
        return f"a {type(value).__name__} module"
    if isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)} item(s): {_REPR.repr(value)}"
    return f"the {type(value).__name__} {_REPR.repr(value)}"


def _short_argument(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor of shape {tuple(value.shape)}>"
    if isinstance(value, torch.nn.Module):
        return f"<{type(value).__name__}>"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return _REPR.repr(value)


def call(function, *args, **kwargs):
    """``function(*args, **kwargs)``; an error it raises becomes a ``LearnerCodeError`` that
    shows the learner's line and the call (``while running my_weights([4, 4, 2])``).

    ``NotImplementedError`` passes through (the exercise is still open). A checker that
    expects the learner's code to raise (``ValueError`` for bad input) calls it directly.
    """
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as error:  # any error of the learner's code is reported
        shown = [_short_argument(a) for a in args]
        shown += [f"{k}={_short_argument(v)}" for k, v in kwargs.items()]
        name = getattr(function, "__name__", "") or "your function"
        name = "your function" if name == "<lambda>" else name
        raise LearnerCodeError(error, during=f"{name}({', '.join(shown)})") from error


def expect_function(answer, call_shown: str) -> None:
    """``ExerciseError`` unless ``answer`` is a function: a learner who passed what their
    function returned, ``check(f(...))`` instead of ``check(f)``, is told so.
    ``call_shown`` is the right call, e.g. ``"check.nb08.buckets_by_hand(plan_by_hand)"``."""
    if not callable(answer):
        raise ExerciseError(f"pass the function itself, {call_shown}, without calling it; "
                            f"you passed {describe(answer)}")


def expect_type(value, types: type | tuple[type, ...], what: str) -> None:
    """``ExerciseError`` unless ``value`` is one of ``types``; ``what`` says what to return.

    ``True``/``False`` do not count as numbers unless ``bool`` is among ``types``.
    """
    types = types if isinstance(types, tuple) else (types,)
    is_bool = isinstance(value, bool) and bool not in types
    if not isinstance(value, types) or is_bool:
        raise ExerciseError(f"{what}; your code returned {describe(value)}")


def expect_tensor_with_grad(value, what: str) -> None:
    """``ExerciseError`` unless ``value`` is a tensor that backward can still go through.

    Tells apart the usual ways of losing the gradient path: a plain number (``.item()``,
    ``float(...)``) and a tensor cut off from the graph (``.detach()``, ``torch.no_grad()``).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ExerciseError(f"{what}; your code returned the plain number {value!r}, which "
                            "backward cannot go through: keep it a tensor (no .item() or "
                            "float())")
    if not isinstance(value, torch.Tensor):
        raise ExerciseError(f"{what}; your code returned {describe(value)}, not a tensor")
    if not value.requires_grad:
        raise ExerciseError(f"{what}; your tensor is cut off from the model (no gradient "
                            "path), as .detach() or torch.no_grad() leave it")


def close(got, want, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    """Whether ``got`` and ``want`` (tensors, or numbers and lists of them) have the same
    shape and values within ``rtol`` and ``atol``, compared in float64; NaN equals NaN. The
    defaults: float64 answers that differ by rounding only."""
    got, want = (torch.as_tensor(v).double() for v in (got, want))
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=rtol, atol=atol,
                                                           equal_nan=True))


def expect_path(path, call: str) -> None:
    """``path`` must be the path of the learner's file; ``call`` shows the checker's call."""
    expect(isinstance(path, (str, os.PathLike)),
           f"pass the path of your file, {call}; you passed {describe(path)}")
