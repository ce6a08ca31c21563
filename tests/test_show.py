"""The code a notebook shows is read from the file where it is defined."""

import inspect

from course_lib.core import collectives
from course_lib.core.zero import Zero1
from course_lib.lessons.show import where


def test_a_decorated_function_is_shown_from_its_own_file_and_line():
    # naive_all_reduce is wrapped by @torch.no_grad(): the wrapper lives in torch's files
    assert collectives.naive_all_reduce is not inspect.unwrap(collectives.naive_all_reduce)
    line = inspect.getsourcelines(inspect.unwrap(collectives.naive_all_reduce))[1]
    assert where(collectives.naive_all_reduce) == f"course_lib/core/collectives.py, line {line}"


def test_a_method_is_shown_from_its_module():
    assert where(Zero1.step).startswith("course_lib/core/zero.py, line ")
