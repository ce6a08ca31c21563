"""Check saved notebooks: every code cell was run, and no unexpected error is saved.

    python scripts/check_notebook.py notebooks/*.ipynb
"""

import json
import sys


def problems(path: str) -> list[str]:
    nb = json.load(open(path))
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or not "".join(cell["source"]).strip():
            continue
        source = "".join(cell["source"])
        if cell.get("execution_count") is None:
            found.append(f"{path}: cell {i} was saved without being run")
        allowed = ("raises-exception" in cell.get("metadata", {}).get("tags", [])
                   or "NBVAL_RAISES_EXCEPTION" in source)
        for out in cell.get("outputs", []):
            if out["output_type"] == "error" and not allowed:
                found.append(f"{path}: cell {i} saved an error: {out['ename']}: {out['evalue']}")
            if out.get("name") == "stderr":
                found.append(f"{path}: cell {i} wrote to stderr: {''.join(out['text'])[:200]}")
    return found


if __name__ == "__main__":
    all_problems = [p for path in sys.argv[1:] for p in problems(path)]
    print("\n".join(all_problems))
    sys.exit(1 if all_problems else 0)
