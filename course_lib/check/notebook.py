"""Missing names in a notebook: an exercise cell run before the cells it depends on.

Importing ``course_lib.check`` inside IPython (a notebook's kernel) installs a handler for
``NameError`` that replaces the traceback with two lines: the missing name, and "if it comes
from a cell above, run the notebook from the top first". Outside IPython nothing changes.

An exercise cell that uses what an earlier section made can say so first::

    check.needs(rows="section 4 (the timeline)")
"""

from __future__ import annotations

import inspect
import sys
import traceback

from course_lib.check import report

_MARK = "_course_name_error_help"  # set on the IPython shell once the handler is installed


class MissingNameError(NameError):
    """Raised by ``needs``: names the cell uses are not defined yet."""

    def __init__(self, missing: dict[str, str]):
        self.missing = missing
        names = ", ".join(f"{name} (from {where})" for name, where in missing.items())
        super().__init__(f"not defined yet: {names}; run the notebook from the top first "
                         "(Run > Run All Cells)")

    def _render_traceback_(self) -> list[str]:
        return report.missing_names_lines(self.missing)


def needs(**where: str) -> None:
    """Stop with a clear message unless every name is defined where this is called.

    ``check.needs(model="section 2", rows="section 4")``: each keyword is a name the cell
    uses, its value the part of the notebook that defines it.
    """
    caller = inspect.currentframe().f_back
    known = {**caller.f_globals, **caller.f_locals}
    missing = {name: place for name, place in where.items() if name not in known}
    if missing:
        raise MissingNameError(missing)


def _show_name_error(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's custom handler: short lines for a name missing in the learner's code."""
    frames = traceback.extract_tb(tb)
    if hasattr(value, "_render_traceback_"):
        lines = value._render_traceback_()
    elif frames and report.is_learner_file(frames[-1].filename):
        lines = report.name_error_lines(value)
    else:  # raised inside a library: the usual traceback
        lines = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    shell._showtraceback(etype, value, lines)


def install_name_error_help() -> bool:
    """Install the handler in the running IPython shell; False (nothing done) outside one,
    or when the shell already has another custom handler."""
    module = sys.modules.get("IPython")
    shell = module.get_ipython() if module else None
    if shell is None:
        return False
    if getattr(shell, _MARK, False):
        return True
    if shell.custom_exceptions:
        return False
    shell.set_custom_exc((NameError,), _show_name_error)
    setattr(shell, _MARK, True)
    return True
