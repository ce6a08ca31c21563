#!/usr/bin/env bash
# Re-execute notebooks in place with the settings CI uses, so the saved outputs are the ones
# nbval will see.   scripts/execute_notebooks.sh                      (every notebook)
#                   scripts/execute_notebooks.sh notebooks/03_*.ipynb   (some)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
source "$ROOT/scripts/ci_env.sh"
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- notebooks/[0-9][0-9]_*.ipynb; fi
status=0
for nb in "$@"; do
  start=$(date +%s)
  if ! (cd "$(dirname "$nb")" && jupyter nbconvert --log-level=WARN --to notebook --execute \
          --inplace --ExecutePreprocessor.timeout=600 "$(basename "$nb")"); then
    echo "[execute] FAILED: $nb (see the error above)"; status=1; continue
  fi
  python "$ROOT/scripts/check_notebook.py" "$nb" || status=1
  echo "[execute] $nb in $(( $(date +%s) - start )) s"
done
exit $status
