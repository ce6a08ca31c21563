#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: the environment, lint, unit tests, then every
# notebook re-executed and compared with its saved outputs by nbval.
#   scripts/test.sh              all of it
#   scripts/test.sh --unit       lint and unit tests only
#   scripts/test.sh --notebooks  notebooks only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
source "$ROOT/scripts/ci_env.sh"
cd "$ROOT"
what="${1:-all}"
status=0
start=$(date +%s)

if [ "$what" != "--notebooks" ]; then
  echo "== lint (ruff)"
  ruff check course_lib tests scripts || status=1
  echo "== unit tests"
  chromium="${COURSE_CHROMIUM:-/usr/bin/chromium}"
  if [ -x "$chromium" ]; then
    echo "[browser] $chromium found: the JupyterLab browser test (tests/browser) runs with them"
  else
    echo "[browser] SKIPPED: no Chromium at $chromium, so the JupyterLab browser test does not" \
         "run (apt-get install chromium, or set COURSE_CHROMIUM)"
  fi
  python -m pytest tests -q -p no:cacheprovider || status=1
fi

if [ "$what" != "--unit" ]; then
  echo "== notebooks (nbval: every cell re-run, every text output compared)"
  python scripts/check_notebook.py notebooks/[0-9][0-9]_*.ipynb || status=1
  python -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
    --nbval-sanitize-with notebooks/nbval_sanitize.cfg --nbval-cell-timeout=600 \
    --timeout=0 notebooks/ || status=1
fi

echo "[time] scripts/test.sh took $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then echo "scripts/test.sh: FAILED"; else echo "scripts/test.sh: all passed"; fi
exit "$status"
