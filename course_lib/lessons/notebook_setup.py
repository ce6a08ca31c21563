"""One call at the top of every notebook: the same plots, printing and randomness everywhere.

    from course_lib.lessons.notebook_setup import setup_notebook
    setup_notebook(seed=0)
"""

from __future__ import annotations

import random
import warnings

import torch

from course_lib.runtime.workspace import workspace_dir

FIGSIZE = (6.4, 3.6)  # inches; every course figure has this size unless it asks otherwise
DPI = 90


def setup_notebook(seed: int = 0, threads: int = 1) -> None:
    """Seed, fix the thread count (results depend on it), round printing, style plots, and
    make the ``workspace/`` folder that ``%%writefile workspace/NAME.py`` cells write into."""
    workspace_dir(create=True)
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=4, sci_mode=False)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        import numpy as np

        np.random.seed(seed)
        np.set_printoptions(precision=4, suppress=True)
    except ImportError:
        pass
    try:
        import matplotlib as mpl

        mpl.rcParams.update({"figure.figsize": FIGSIZE, "figure.dpi": DPI,
                             "savefig.dpi": DPI, "axes.grid": True, "grid.alpha": 0.3,
                             "font.size": 10})
    except ImportError:
        pass


def timing(label: str, seconds: float) -> str:
    """A timing line: it starts with ``[time]`` so nbval's sanitize rule blanks it."""
    return f"[time] {label}: {seconds:.3f} s"


def rounding(value: float) -> str:
    """A figure at floating-point rounding level, as ``~3e-07`` (``~0`` for an exact zero).

    Its digits change with the CPU's vector instructions (AVX-512, AVX2, another BLAS), so
    nbval's sanitize rule masks what follows the ``~``. Print it beside the bound the cell
    asserts, which every CPU meets: ``f"relative error {rounding(e)} (at most 1e-6)"``."""
    return "~0" if value == 0 else f"~{value:.0e}"
