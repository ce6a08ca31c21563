"""Which names a learner's function uses: to refuse an answer that calls the very function
the exercise asks to write (``plan_buckets`` for "plan the buckets by hand").

    used = names_used(plan_by_hand, ("plan_buckets", "DistributedSampler"))
    expect(not used, f"plan_by_hand calls the library's {used[0]}: ...")

Names are read from the function's code (and the code of functions and lambdas inside it),
so an answer is caught whether it calls ``plan_buckets(...)`` or ``buckets.plan_buckets(...)``.
"""

from __future__ import annotations

import types


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def names_used(function, names: tuple[str, ...]) -> list[str]:
    """The names among ``names`` that ``function``'s code refers to, in the order given."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)  # methods too
    if code is None:
        return []
    seen = set()
    for part in _code_objects(code):
        seen.update(part.co_names)
        seen.update(part.co_varnames)
    return [name for name in names if name in seen]
