"""How a failed exercise looks in a notebook: a few lines, and none of the checker's code.

IPython shows the lines an exception's ``_render_traceback_()`` returns instead of its
traceback; the exceptions of ``checker.py`` return the lines made here. Every function returns
at most ``MAX_LINES`` lines. JupyterLab already draws an error on a tinted background (pink in
the light theme, dark red in the dark one); the text keeps the theme's own colour on it, which
reads at better than 4.5:1 in both, and only the title and the exception are bold (ANSI red on
that pink reads at about 2.7:1). Each line of a hint that holds several (where, the learner's
line, the exception, what to do) stays a line of its own.
"""

from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
import textwrap
import traceback
from pathlib import Path

BOLD, RESET = "\x1b[1m", "\x1b[0m"
MAX_LINES = 10
WIDTH = 90  # characters per hint line
MAX_FRAMES = 2  # lines of the learner's code shown for an error
EXCEPTION_LINE = re.compile(r"^[A-Z]\w*(Error|Exception|Interrupt|Warning)\b")
RUN_FROM_THE_TOP = ("If it comes from a cell above, run the notebook from the top first "
                    "(Run > Run All Cells); if it is your own name, check its spelling.")
COURSE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep  # course_lib/


def _library_dirs() -> tuple[str, ...]:
    """Folders of Python itself and of installed packages: code there is not the learner's."""
    paths = {sys.prefix, *site.getsitepackages()}
    paths.update(sysconfig.get_paths().get(key, "") for key in ("stdlib", "platstdlib",
                                                                "purelib", "platlib"))
    return tuple(str(Path(p).resolve()) + os.sep for p in paths if p)


LIBRARY_DIRS = _library_dirs()


def is_learner_file(filename: str) -> bool:
    """True for a notebook cell or the learner's own file; False for course_lib and libraries."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    path = os.path.realpath(filename)
    return not path.startswith(COURSE_DIR) and not path.startswith(LIBRARY_DIRS)


def learner_frames(tb) -> list[traceback.FrameSummary]:
    """The frames of a traceback that run the learner's code, outermost first; a frame on
    the same line as the one before (a list comprehension's) counts once."""
    frames = []
    for frame in traceback.extract_tb(tb):
        same_line = frames and (frames[-1].filename, frames[-1].lineno) == (frame.filename,
                                                                            frame.lineno)
        if is_learner_file(frame.filename) and not same_line:
            frames.append(frame)
    return frames


def _ipython():
    module = sys.modules.get("IPython")
    return module.get_ipython() if module else None


def place(frame: traceback.FrameSummary) -> str:
    """``Cell In[5], line 3, in my_weights`` (a notebook cell) or ``ring.py, line 3, in main``."""
    format_code_name = getattr(getattr(_ipython(), "compile", None), "format_code_name", None)
    named = format_code_name(frame.filename) if format_code_name else None
    name = " ".join(named) if named else Path(frame.filename).name
    where = "" if frame.name == "<module>" else f", in {frame.name}"
    return f"{name}, line {frame.lineno}{where}"


def shorten(text: str, width: int = 2 * WIDTH, keep_spaces: bool = False) -> str:
    text = str(text).strip() if keep_spaces else " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def error_line(error: BaseException) -> str:
    """``TypeError: list indices must be integers or slices, not float``, on one line."""
    message = str(error).strip().split("\n")[0] if str(error).strip() else ""
    return shorten(f"{type(error).__name__}: {message}" if message else type(error).__name__)


def _fit(head: list[str], body: list[str], tail: list[str]) -> list[str]:
    """``head + body + tail`` cut to ``MAX_LINES``; the body gives way, ending in "..."."""
    room = MAX_LINES - len(head) - len(tail)
    if len(body) > room:
        body = body[: max(room, 0)]
        if body:
            body[-1] = body[-1].removesuffix(RESET) + " ..." + RESET
    return (head + body + tail)[:MAX_LINES]


def _wrapped(text: str) -> list[str]:
    """``text`` in lines of at most ``WIDTH``: each of its own lines wrapped on its own; an
    indented line (the learner's code) kept as it is, cut if too long; an exception's line
    (``ValueError: ...``) in bold."""
    lines = []
    for line in str(text).strip().split("\n"):
        if line.startswith(" ") and line.strip():
            lines.append("    " + shorten(line, WIDTH - 4, keep_spaces=True))
        elif EXCEPTION_LINE.match(line):
            lines += [BOLD + part + RESET for part in textwrap.wrap(line, WIDTH)]
        else:
            lines += textwrap.wrap(" ".join(line.split()), WIDTH)
    return lines


def _title(exercise_id: str | None, what: str) -> str:
    return BOLD + (f"Exercise {exercise_id}: {what}" if exercise_id else what.capitalize()) \
        + RESET


def _more_help(exercise_id: str | None) -> list[str]:
    return [f'Stuck? check.hint("{exercise_id}") gives a nudge.']


def wrong_answer_lines(exercise_id: str | None, hint: str, more_help: bool,
                       what: str = "not right yet.") -> list[str]:
    """The answer ran but is wrong (or the learner's file raised: ``what`` says so): a bold
    title and the hint, line by line."""
    tail = _more_help(exercise_id) if more_help else []
    return _fit([_title(exercise_id, what)], _wrapped(hint), tail)


def code_error_lines(exercise_id: str | None, error: BaseException, during: str | None,
                     hint: str, more_help: bool) -> list[str]:
    """The learner's code raised: where (their lines only), the error, then the hint."""
    head = [_title(exercise_id, "your code raised an error.")]
    if during:
        head.append(shorten(f"while running {during}", WIDTH))
    for frame in learner_frames(error.__traceback__)[-MAX_FRAMES:]:
        head.append(f"  {place(frame)}")
        if frame.line:
            head.append(f"    {shorten(frame.line, WIDTH, keep_spaces=True)}")
    head.append(BOLD + error_line(error) + RESET)
    tail = _more_help(exercise_id) if more_help else []
    return _fit(head, _wrapped(hint) if hint else [], tail)


def name_error_lines(error: NameError) -> list[str]:
    """A name the cell needs is missing: which one, and the likely reason."""
    return [BOLD + error_line(error) + RESET, RUN_FROM_THE_TOP]


def missing_names_lines(missing: dict[str, str]) -> list[str]:
    """``check.needs(...)`` found names undefined: each one and where it comes from."""
    lines = [BOLD + f"NameError: {name} is not defined yet; it comes from {where}" + RESET
             for name, where in missing.items()]
    return _fit([], lines, ["Run the notebook from the top first (Run > Run All Cells)."])
