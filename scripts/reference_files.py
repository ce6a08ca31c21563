"""Write the course's own answers to the file exercises, as the reference notebooks write them.

    python scripts/reference_files.py OUT_DIR        # OUT_DIR/token_ring.py, my_ring.py, ...

Each ``%%writefile workspace/NAME.py`` cell of notebooks/, solution markers and student
versions left out (what nbval runs). Later files import earlier ones from the same folder, as
in a notebook's workspace. ``scripts/gpu_check.sh`` runs each under torchrun on the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib.check.exercise_cells import written_file  # noqa: E402
from course_lib.check.reference import NOTEBOOKS, read_notebook  # noqa: E402
from course_lib.check.student_copy import reference_lines  # noqa: E402


def reference_files() -> dict[str, str]:
    """File name -> its text, in course order (a file written twice keeps its last text)."""
    files = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")):
        for cell in read_notebook(path).cells:
            name = written_file(cell.source) if cell.cell_type == "code" else None
            if name and name.startswith("workspace/"):
                body = cell.source.split("\n", 1)[1]
                files[Path(name).name] = "\n".join(reference_lines(body.split("\n"))) + "\n"
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write them into")
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name, text in reference_files().items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
