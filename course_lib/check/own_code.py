"""Does the learner's function hand the exercise to the library's answer?

    expect_own_code(my_rows, micro_batch_slice, "write the arithmetic yourself")

The names a function's code uses (its own and those of the functions and lambdas defined in
it) are read from its compiled code, so an import under another name, a call through the module
(``batching.micro_batch_slice``) and the library function passed in itself are all seen.
"""

from __future__ import annotations

import types

from course_lib.check.core import expect


def names_used(function) -> set[str]:
    """Every global, attribute and free-variable name the function's code mentions."""
    code = getattr(function, "__code__", None)
    found, todo = set(), [code] if code is not None else []
    while todo:
        code = todo.pop()
        found.update(code.co_names, code.co_freevars)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return found


def objects_used(function) -> list:
    """The objects behind the names: the function's globals and its closure's cells."""
    scope = getattr(function, "__globals__", {})
    cells = [c.cell_contents for c in (getattr(function, "__closure__", None) or ())
             if _filled(c)]
    return [scope[name] for name in names_used(function) if name in scope] + cells


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


def calls_library(function, library_function, name: str) -> bool:
    return (function is library_function or name in names_used(function)
            or any(obj is library_function for obj in objects_used(function)))


def expect_own_code(function, library_function, what: str, name: str | None = None) -> None:
    """``ExerciseError`` when ``function`` is or uses ``library_function`` (known as ``name``
    where its ``__name__`` differs from the name it is called by)."""
    name = name or library_function.__name__
    expect(not calls_library(function, library_function, name),
           f"your function uses the library's {name}, which is the answer itself: {what}")
