#!/usr/bin/env bash
# Install the course (first time: a few minutes) and open it in JupyterLab.
#   scripts/start.sh                    the course, opened on notebook 00
#   scripts/start.sh --student          workshop copies with the exercises open (in student/);
#                                       again: every notebook and file you changed is kept
#   scripts/start.sh --student --reset  the same, from fresh copies (yours go to student/previous/)
#   PORT=9999 scripts/start.sh          another port (default: the first free one from 8888)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: scripts/start.sh [--student [--reset]] [--help]"
student=0; reset=0
for arg in "$@"; do
  case "$arg" in
    --student) student=1 ;;
    --reset) reset=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg (use --student, --reset or --help)" >&2
       echo "$usage" >&2; exit 2 ;;
  esac
done
if [ "$reset" = 1 ] && [ "$student" = 0 ]; then
  echo "error: --reset goes with --student" >&2; echo "$usage" >&2; exit 2
fi
case "${PORT:-8888}" in
  *[!0-9]*) echo "error: PORT=${PORT:-} is not a port number; set e.g. PORT=8888" >&2; exit 2 ;;
esac
source "$ROOT/scripts/env.sh" || exit 1  # its error line says what failed
cd "$ROOT"

folder="notebooks"
if [ "$student" = 1 ]; then
  args=(--out student); [ "$reset" = 1 ] && args+=(--reset)
  python scripts/make_student_notebooks.py "${args[@]}"
  folder="student"
fi

port="$(python - "${PORT:-8888}" <<'PY'
import socket, sys
start = int(sys.argv[1])
for port in range(start, start + 100):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break
PY
)"
[ -n "$port" ] || { echo "error: no free port from ${PORT:-8888} on; set PORT=..." >&2; exit 1; }
token="$(python -c 'import secrets; print(secrets.token_hex(16))')"
root_flag=(); [ "$(id -u)" != 0 ] || root_flag=(--allow-root)  # JupyterLab refuses root else
# Jupyter also reads config from JUPYTER_CONFIG_PATH (first), beside the user's own ~/.jupyter:
# scripts/jupyter/labconfig/page_config.json switches off the "Jupyter news?" pop-up.
export JUPYTER_CONFIG_PATH="$ROOT/scripts/jupyter${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
url="http://127.0.0.1:$port/lab/tree/00_start_here.ipynb?token=$token"
cat <<MSG

  The course is starting. Open this address in your browser:

      $url

  Stop JupyterLab with Ctrl-C in this terminal (twice, or once and answer y).

MSG
exec jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port="$port" --ServerApp.port_retries=0 \
  --IdentityProvider.token="$token" --ServerApp.open_browser=False \
  --ServerApp.root_dir="$ROOT/$folder" ${root_flag[@]+"${root_flag[@]}"}  # empty: bash 3.2-safe
