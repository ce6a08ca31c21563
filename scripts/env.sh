#!/usr/bin/env bash
# Makes the course environment (.venv) current and activates it. start.sh, test.sh and
# execute_notebooks.sh source it; from your own bash shell:   source scripts/env.sh
# The environment is reused while requirements.txt is unchanged; a change reinstalls it.
#   COURSE_VENV=/some/folder   use that folder instead of .venv
#   PYTHON=/path/to/python3    the Python to create it with (3.11 or newer)
# Safe to source: it sets no shell options, and a failure returns 1 with an error line (exit 1
# when run as `bash scripts/env.sh`, which installs but cannot activate your shell).
if [ -z "${BASH_VERSION:-}" ]; then  # zsh and sh cannot read the rest: say so, do nothing
  echo "error: scripts/env.sh needs bash; run 'bash' first, then source it" >&2
  return 1 2>/dev/null || exit 1
fi

_course_python() {  # the first Python >= 3.11 found
  local py
  for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "error: this course needs Python 3.11 or newer; install it, or set" \
       "PYTHON=/path/to/python3.11" >&2
  return 1
}

_course_sha256() {  # sha256sum on Linux, shasum on macOS
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1"; else shasum -a 256 "$1"; fi \
    | cut -d' ' -f1
}

_course_pip() {  # pip install ARGS..., minus its harmless "WARNING: Location" lines
  local python="$1"; shift
  "$python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | grep -v "^WARNING: Location" >&2
  return "${PIPESTATUS[0]}"  # pip's status, not grep's (grep fails when it prints nothing)
}

_course_env() {  # every step checked by hand: errexit is off in a function called with ||
  local root venv want have py log
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  venv="${COURSE_VENV:-$root/.venv}"
  want="$(_course_sha256 "$root/requirements.txt")"
  [ -n "$want" ] || { echo "error: cannot read $root/requirements.txt" >&2; return 1; }
  have="$(cat "$venv/.requirements.sha256" 2>/dev/null)"
  if [ "$want" != "$have" ] || [ ! -x "$venv/bin/python" ]; then
    py="$(_course_python)" || return 1
    echo "[setup] creating the course environment in $venv (a few minutes the first time)"
    if [ ! -x "$venv/bin/python" ] && ! "$py" -m venv "$venv"; then
      echo "error: $py could not create $venv (Debian/Ubuntu: apt install python3-venv)" >&2
      return 1
    fi
    rm -f "$venv/.requirements.sha256"  # recorded again only once the install succeeds
    if ! _course_pip "$venv/bin/python" --upgrade pip \
        || ! _course_pip "$venv/bin/python" -r "$root/requirements.txt"; then
      echo "error: pip could not install requirements.txt into $venv (pip's message is" \
           "above); fix what it names (network, proxy, disk space) and run this again" >&2
      return 1
    fi
    # jsonschema imports rfc3987-syntax when it is there, which builds an IRI grammar: 2.5 s of
    # CPU in every process that imports nbformat (Jupyter, nbval, pytest). Nothing here checks
    # that a string is an IRI, so the package goes again (requirements.txt pins it for pip).
    if ! "$venv/bin/python" -m pip uninstall --quiet --yes rfc3987-syntax; then
      echo "error: pip could not remove rfc3987-syntax from $venv" >&2
      return 1
    fi
    if ! "$venv/bin/python" -c "import torch, jupyterlab, nbval, ipywidgets, matplotlib"; then
      echo "error: installing requirements.txt failed; see the messages above" >&2
      return 1
    fi
    echo "$want" > "$venv/.requirements.sha256" || return 1
    echo "[setup] environment ready"
  fi
  # The course's own package, installed in editable mode (pyproject.toml): every Python of the
  # environment, its Jupyter kernels and the processes they launch import course_lib from here.
  if ! "$venv/bin/python" -P -c 'import os, sys, course_lib
sys.exit(os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__))) != sys.argv[1])' \
      "$root" 2>/dev/null; then
    if ! log="$("$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
               --no-deps -e "$root" 2>&1)"; then  # its build chatter only when it fails
      echo "$log" >&2
      echo "error: installing the course package (pip install -e .) failed; see above" >&2
      return 1
    fi
  fi
  # shellcheck disable=SC1091
  source "$venv/bin/activate" || { echo "error: cannot activate $venv" >&2; return 1; }
}

_course_status=0
_course_env || _course_status=$?  # with ||: the caller's set -e cannot end the shell half-way
unset -f _course_python _course_sha256 _course_pip _course_env
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit "$_course_status"; fi  # run, not sourced
if [ "$_course_status" = 0 ]; then unset _course_status; return 0; fi
unset _course_status
return 1
