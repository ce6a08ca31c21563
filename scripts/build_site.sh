#!/usr/bin/env bash
# Builds the course's website into OUT_DIR (default: _site): the README as the front page, then
# every notebook in course order, as a learner meets it (the student copy: no solution, the
# exercises open) with the outputs saved in it. Nothing is executed, and nothing is fetched
# while building or when a page is read: every script and font is in OUT_DIR.
#   scripts/build_site.sh [OUT_DIR]       build (installs what it needs the first time)
#   scripts/build_site.sh --install-only  only make the site's environment current
# Then serve it, as a web host does:  python3 -m http.server -d _site -b 127.0.0.1 8000
# The build tools (requirements-site.txt) live in their own environment, .venv-site (set
# COURSE_SITE_VENV for another folder), apart from the course's .venv; MathJax 3 and the widgets'
# HTML manager (site/vendor.txt) come from the npm registry with npm, once, into it. The student
# copies come from the course's .venv (scripts/env.sh), which this script also makes current.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SITE_VENV="${COURSE_SITE_VENV:-$ROOT/.venv-site}"
# The staged source and Sphinx's cache, reused by the next build (COURSE_SITE_WORK: elsewhere)
WORK="${COURSE_SITE_WORK:-$ROOT/.site-build}"
usage="usage: scripts/build_site.sh [OUT_DIR | --install-only | --help]"
out="$ROOT/_site"; install_only=0
case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
  --install-only) install_only=1 ;;
  -*) echo "error: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
  "") ;;
  *) out="$1" ;;
esac
[ "$#" -le 1 ] || { echo "$usage" >&2; exit 2; }

sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi \
  | cut -d' ' -f1; }

quiet_pip() {  # pip install ARGS... into the site's environment, minus its "Location" warnings
  "$SITE_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location" || true; } >&2
  return "${PIPESTATUS[0]}"
}

vendor() {  # each package of site/vendor.txt, checked against its integrity, into $1
  local dest="$1" tmp spec integrity folder paths got
  command -v npm >/dev/null 2>&1 || { echo "error: npm not found; the site vendors MathJax" \
    "and the widgets' HTML manager from the npm registry with it (install Node.js and npm)" >&2
    return 1; }
  tmp="$(mktemp -d)"
  while read -r spec integrity folder paths; do
    case "$spec" in ''|'#'*) continue ;; esac
    rm -rf "${tmp:?}"/*
    (cd "$tmp" && npm pack --quiet "$spec" >/dev/null) \
      || { echo "error: npm could not fetch $spec" >&2; rm -rf "$tmp"; return 1; }
    got="sha512-$("$SITE_VENV/bin/python" -c 'import base64, hashlib, sys
print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' \
      "$tmp"/*.tgz)"
    if [ "$got" != "$integrity" ]; then
      echo "error: $spec from the registry has integrity $got, not $integrity (site/vendor.txt)" >&2
      rm -rf "$tmp"; return 1
    fi
    tar -xzf "$tmp"/*.tgz -C "$tmp"
    mkdir -p "$dest/$folder"
    # shellcheck disable=SC2086  # the paths are globs, expanded inside the package
    (cd "$tmp/package" && tar -cf - $paths) | (cd "$dest/$folder" && tar -xf -) \
      || { echo "error: $spec lacks a path site/vendor.txt names: $paths" >&2
           rm -rf "$tmp"; return 1; }
    echo "[site] vendored $spec into _vendor/$folder"
  done < "$ROOT/site/vendor.txt"
  rm -rf "$tmp"
}

site_env() {  # .venv-site with requirements-site.txt and the vendored scripts, made once
  local want have py
  want="$(cat "$ROOT/requirements-site.txt" "$ROOT/site/vendor.txt" | sha256)"
  have="$(cat "$SITE_VENV/.site.sha256" 2>/dev/null || true)"
  [ "$want" = "$have" ] && [ -x "$SITE_VENV/bin/jupyter-book" ] && return 0
  echo "[site] installing the site's build tools into $SITE_VENV (about a minute, once)"
  local start=$SECONDS
  py="${PYTHON:-python3}"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null \
    || { echo "error: the site's build tools need Python 3.9 or newer as $py (set PYTHON)" >&2
         return 1; }
  rm -f "$SITE_VENV/.site.sha256"  # recorded again only once everything is installed
  [ -x "$SITE_VENV/bin/python" ] || "$py" -m venv "$SITE_VENV"
  quiet_pip -r "$ROOT/requirements-site.txt" \
    || { echo "error: pip could not install requirements-site.txt into $SITE_VENV" >&2
         return 1; }
  rm -rf "$SITE_VENV/vendor"
  vendor "$SITE_VENV/vendor"
  echo "$want" > "$SITE_VENV/.site.sha256"
  echo "[time] the site's environment took $(( SECONDS - start )) s to install"
}

case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
if [ -e "$out" ] && [ ! -f "$out/.buildinfo" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "error: $out exists and is not a site this script built (it replaces the folder" \
       "whole); give a new or empty folder" >&2
  exit 2
fi
site_env
[ "$install_only" = 1 ] && exit 0

# shellcheck disable=SC1091
source "$ROOT/scripts/env.sh" || exit 1  # the course's Python makes the student copies
start=$SECONDS
# Where the repository is, for links to its files and the header's repository button: GitHub
# Actions says so; elsewhere the clone's origin does; with neither, such links become text.
if [ -z "${SITE_REPOSITORY_URL:-}" ]; then
  if [ -n "${GITHUB_REPOSITORY:-}" ]; then
    SITE_REPOSITORY_URL="${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_REPOSITORY"
  else
    origin="$(git -C "$ROOT" remote get-url origin 2>/dev/null || true)"
    case "$origin" in
      git@*:*) origin="${origin#git@}"; origin="https://${origin/://}" ;;
    esac
    case "$origin" in https://*) SITE_REPOSITORY_URL="${origin%.git}" ;; esac
  fi
fi
export SITE_REPOSITORY_URL="${SITE_REPOSITORY_URL:-}"
python "$ROOT/site/stage.py" "$WORK/src"
echo "[site] building with Jupyter Book (nothing executed; a warning fails the build)"
log="$WORK/build.log"
if ! SITE_VENDOR_DIR="$SITE_VENV/vendor" "$SITE_VENV/bin/jupyter-book" build "$WORK/src" \
    --path-output "$WORK" --builder html --warningiserror --keep-going >"$log" 2>&1; then
  cat "$log" >&2
  rm -rf "$WORK/_build"  # so that the next build reads every page again and warns again
  echo "error: the site did not build; Sphinx's messages are above" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$(dirname "$out")"
cp -R "$WORK/_build/html" "$out"
pages="$(find "$out" -name '*.html' -not -path "$out/_*" | wc -l | tr -d ' ')"
echo "[time] site built in $(( SECONDS - start )) s: $pages pages in $out"
