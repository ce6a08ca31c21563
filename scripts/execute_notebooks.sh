#!/usr/bin/env bash
# Re-execute notebooks in place with the settings CI uses, so the saved outputs are the ones
# nbval will see.   scripts/execute_notebooks.sh                      (every notebook)
#                   scripts/execute_notebooks.sh notebooks/03_*.ipynb   (some)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: scripts/execute_notebooks.sh [NOTEBOOK.ipynb ...] [--help]"
for arg in "$@"; do  # checked before the environment is installed
  case "$arg" in
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $arg" >&2; echo "$usage" >&2; exit 2 ;;
    *.ipynb) [ -f "$arg" ] || { echo "error: no file $arg" >&2; echo "$usage" >&2; exit 2; } ;;
    *) echo "error: $arg is not a notebook (.ipynb)" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
source "$ROOT/scripts/env.sh" || exit 1  # its error line says what failed
source "$ROOT/scripts/ci_env.sh"
if [ "$#" -eq 0 ]; then cd "$ROOT"; set -- notebooks/[0-9][0-9]*_*.ipynb; fi  # else: as given
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
