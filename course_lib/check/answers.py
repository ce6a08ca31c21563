"""Helpers for checkers: call the learner's function, check the kind of value it returned.

    got = call(my_weights, [4, 4, 2])  # an error in my_weights shows the learner's line
    got = [as_number(w, "each weight is one number") for w in as_numbers(got, "return ...")]
    expect_tensor_with_grad(loss, "return the loss to call backward on")

Each raises ``ExerciseError`` (or ``LearnerCodeError``) with a message that says what was
expected and what came back, so a wrong kind of answer never crashes inside the checker.
A number is any real number Python knows (int, float, numpy's scalars, a Fraction; not
True/False) or a tensor or array holding one; numbers in order are a list, a tuple, an
iterator or a 1-D tensor or array.
"""

from __future__ import annotations

import numbers
import operator
import os
import reprlib
from collections.abc import Callable, Iterator

import numpy as np
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
    if isinstance(value, np.ndarray):
        return f"a numpy array of shape {value.shape}"
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


def _one_element(value):
    """A tensor or numpy array of one element as the Python number it holds; else ``value``."""
    one = (isinstance(value, torch.Tensor) and value.numel() == 1
           or isinstance(value, np.ndarray) and value.size == 1)
    return value.item() if one else value


def as_number(value, what: str, returned: str = "your code returned") -> float:
    """``value`` as a float when it is one real number (see the module docstring); else
    ``ExerciseError``: "``what``; ``returned`` <the value>" ("one of yours is" for an item)."""
    value = _one_element(value)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ExerciseError(f"{what}; {returned} {describe(value)}")
    return float(value)


def as_whole_number(value, what: str) -> int:
    """``value`` as an int when it is one whole number: an int, a numpy integer or an integer
    tensor or array of one element (not a float, not True/False); else ``ExerciseError``."""
    value = _one_element(value)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ExerciseError(f"{what}; your code returned {describe(value)}")
    return operator.index(value)


def as_numbers(value, what: str) -> list:
    """``value``'s items, in order, when it holds them in order: a list, tuple or range, an
    iterator (``map``, a generator) or a 1-D tensor or numpy array; else ``ExerciseError``.
    The items are left as they are: ``as_number`` checks each."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, (list, tuple, range, Iterator)):
        return list(value)
    raise ExerciseError(f"{what}; your code returned {describe(value)}")


def expect_raises(run: Callable[[], object], kind: type[Exception], when: str,
                  returned: str) -> None:
    """``run()``, a call of the learner's code (through ``call`` or ``call_own``) on input the
    exercise asks to refuse, must raise ``kind``. Another error is shown with the learner's
    line and the hint "``when``: the exercise asks for a ValueError here"; a value returned
    gives the report ``returned``, "{got}" in it standing for what came back."""
    try:
        got = run()
    except LearnerCodeError as raised:
        if isinstance(raised.error, kind):
            return
        raise LearnerCodeError(raised.error, raised.during,
                               hint=f"{when}: the exercise asks for a {kind.__name__} here, "
                                    f"not the {type(raised.error).__name__} your code raised")\
            from raised.error
    raise ExerciseError(returned.replace("{got}", describe(got)))


def expect_full_precision(got: torch.Tensor, want: torch.Tensor, keep: str,
                          rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """``ExerciseError`` when ``got`` is not ``want`` (float64) to ``rtol`` and ``atol``, the
    checker's own tolerance, but is to float32's precision: the hint names the cause, float32
    somewhere, and ``keep`` says what to keep ("w's dtype")."""
    if close(got, want, rtol, atol) or not close(got, want, rtol=1e-4, atol=1e-6):
        return  # right, or wrong by more than float32's rounding: another hint's business
    where = (f"your result is {str(got.dtype).removeprefix('torch.')}"
             if got.dtype != torch.float64 else "some step of your computation runs in float32")
    raise ExerciseError(f"right to float32's precision only: {where}, while the inputs are "
                        "float64 and the check asks for float64's precision. A tensor made "
                        "without a dtype (torch.zeros(n), torch.tensor of Python floats) is "
                        f"float32, as is .float(): keep {keep}")


def expect_tensor_with_grad(value, what: str) -> None:
    """``ExerciseError`` unless ``value`` is a tensor that backward can still go through.

    Tells apart the usual ways of losing the gradient path: a plain number (``.item()``,
    ``float(...)``), a tensor cut off from the graph (``.detach()``, ``torch.no_grad()``) and
    a new leaf that requires a gradient but comes from no model output.
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
    if value.grad_fn is None:  # requires_grad=True on a tensor of its own: a new leaf
        raise ExerciseError(f"{what}; your tensor is a new one (torch.tensor(..., "
                            "requires_grad=True), say), made from numbers, not from the "
                            "model's output: backward on it reaches no parameter")


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
