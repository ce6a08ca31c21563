#!/usr/bin/env bash
# Sourced by start.sh, test.sh and execute_notebooks.sh: makes .venv current and activates it.
# The environment is reused while requirements.txt is unchanged; a change reinstalls it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

pick_python() {
  for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "error: this course needs Python 3.11 or newer; install it or set PYTHON=/path/to/python3.11" >&2
  return 1
}

want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
have="$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)"
if [ "$want" != "$have" ] || [ ! -x "$VENV/bin/python" ]; then
  PY="$(pick_python)"
  echo "[setup] creating the course environment in .venv (a few minutes the first time)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt" 2>&1 \
    | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c "import torch, jupyterlab, nbval, ipywidgets, matplotlib" \
    || { echo "error: installing requirements.txt failed; see the messages above" >&2; exit 1; }
  echo "$want" > "$VENV/.requirements.sha256"
  echo "[setup] environment ready"
fi
# The course's own package, installed in editable mode (pyproject.toml): every Python of .venv,
# its Jupyter kernels and the processes they launch import course_lib from this checkout.
if ! "$VENV/bin/python" -P -c 'import os, sys, course_lib
sys.exit(os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__))) != sys.argv[1])' \
    "$ROOT" 2>/dev/null; then
  log="$("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
         -e "$ROOT" 2>&1)" \
    || { echo "$log" >&2; echo "error: installing the course package (pip install -e .) failed" >&2
         exit 1; }
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
