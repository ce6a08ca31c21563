"""Did the learner write it, or call the course's own version? For exercises whose point is to
write something the notebook also uses from ``course_lib`` (``replicas.warmup_lr``, ...).

    got = call_own(my_warmup_lr, 0, 0.4, 4, library=[replicas.warmup_lr])

runs the learner's function like ``answers.call`` and fails with a hint if, while it ran, one
of the ``library`` functions (a class: its ``__init__``) ran too, however it was imported or
renamed, or passed instead of the learner's own (the check looks at the code each call
enters, not at names).

A learner's file (``workspace/NAME.py``, launched on several processes) is read, not run:
``expect_own_file(path, refused, who)`` fails with a hint when the file's code (outside its
``__main__`` block, or inside the named functions only) uses one of ``refused``'s names, read
through the file's imports (``dist.all_reduce`` is ``torch.distributed.all_reduce``, an import
counts as a use). The tracer catches, while the file runs, a call made through a helper.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
from typing import Callable, Iterable

from course_lib.check.answers import call
from course_lib.check.checker import ExerciseError

ANSWER_ITSELF = "your function uses the library's {name}, which is the answer itself: "


def short_name(function: Callable) -> str:
    """``replicas.warmup_lr`` for ``course_lib.lessons.replicas.warmup_lr``."""
    return f"{function.__module__.rsplit('.', 1)[-1]}.{function.__qualname__}"


@contextlib.contextmanager
def watching(functions: Iterable[Callable]):
    """Inside the block, note each of ``functions`` that is entered (a list, in order)."""
    functions = list(functions)
    codes = {inspect.unwrap(f).__code__: f for f in functions}  # decorated ones too
    cached = [f for f in functions if hasattr(f, "cache_info")]  # a cache hit runs no code:
    calls = [_cache_calls(f) for f in cached]                    # its counters tell
    entered: list[Callable] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            entered.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield entered
    finally:
        sys.setprofile(previous)
        entered += [f for f, before in zip(cached, calls, strict=True) if _cache_calls(f) > before
                    and f not in entered]


def _cache_calls(function) -> int:
    info = function.cache_info()
    return info.hits + info.misses


def call_own(function: Callable, *args, library: Iterable[Callable],
             hint: str | dict[Callable, str] | None = None, **kwargs):
    """``call(function, *args, **kwargs)``; ``ExerciseError`` if it ran a ``library``
    function. The hint is ``hint``, or ``hint[f]`` for the first library function ``f`` it
    ran (a dict tells apart, say, autograd and the course's own version), "{name}" in it
    standing for that function's name; by default it names the function and asks for the
    learner's own code."""
    with watching(library) as entered:
        try:
            result = call(function, *args, **kwargs)
        except ExerciseError:
            if not entered:  # an error inside the course's own version: that is the report
                raise
    if entered:
        own = hint.get(entered[0]) if isinstance(hint, dict) else hint
        name = entered[0].__qualname__.removesuffix(".__init__").lstrip("_")  # a class too
        raise ExerciseError((own or f"your code calls {short_name(entered[0])}, the course's "
                                    "own version: the exercise is to write it yourself, so "
                                    "leave that function out and work it out in your code")
                            .replace("{name}", name))
    return result


# ---- a learner's file, read without running it -------------------------------------------------

def _imported(tree: ast.Module) -> dict[str, str]:
    """{local name: the full name it stands for}: dist -> torch.distributed, ..."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # import torch.distributed as dist; import torch
                local = a.asname or a.name.split(".")[0]
                names[local] = a.name if a.asname else local
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return names


def code_scope(tree: ast.Module, functions: tuple[str, ...]) -> list[ast.AST]:
    """The code that counts: the named functions (or classes), else the whole file but its
    ``if __name__ == "__main__":`` block."""
    if functions:
        return [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                and n.name in functions]
    return [n for n in tree.body
            if not (isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))]


def names_in_file(path: str, functions: tuple[str, ...] = ()) -> list[tuple[str, str, int]]:
    """(full name, name as written, line) of every name the file's code uses, in order."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported, found = _imported(tree), []
    for node in (n for top in code_scope(tree, functions) for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(f"{node.module}.{a.name}", f"{node.module}.{a.name}", node.lineno)
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, a.name, node.lineno) for a in node.names]
        elif isinstance(node, (ast.Name, ast.Attribute)):
            written = ast.unparse(node)
            head, _, rest = written.partition(".")
            full = ".".join(filter(None, [imported.get(head, head), rest]))
            found.append((full, written, node.lineno))
    return sorted(found, key=lambda use: use[2])


def _matches(full: str, name: str) -> bool:
    """``name`` is a module or object and everything in it (``course_lib.core.zero``); a bare
    one is also any name or attribute that ends so (``register_comm_hook``)."""
    return (full == name or full.startswith(name + ".")
            or ("." not in name and full.rsplit(".", 1)[-1] == name))


def shown(full: str, written: str) -> str:
    """How a hint names a use: dist.all_reduce, the library's ring_all_reduce, ..."""
    last = full.rsplit(".", 1)[-1]
    if full.startswith("torch.distributed.") and full.count(".") == 2:
        return f"dist.{last}"
    return f"the library's {last}" if full.startswith("course_lib.") else written


def refused_use(path: str, refused: dict[str, str],
                functions: tuple[str, ...] = ()) -> tuple[str, int, str] | None:
    """(the use as a hint names it, its line, why it is refused) of the first name of
    ``refused`` ({name: why}) the file uses; None if none."""
    for full, written, line in names_in_file(path, functions):
        why = next((why for name, why in refused.items() if _matches(full, name)), None)
        if why is not None:
            return shown(full, written), line, why
    return None


def expect_own_file(path: str, refused: dict[str, str], who: str = "your file",
                    functions: tuple[str, ...] = ()) -> None:
    """``ExerciseError`` when the file uses a name of ``refused`` ({name: why}): "``who``
    calls dist.all_reduce (line 12): ``why``"."""
    found = refused_use(path, refused, functions)
    if found:
        use, line, why = found
        raise ExerciseError(f"{who} uses {use} (line {line}): {why}")
