#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: the environment, lint, then in one pytest session
# the unit tests and every notebook re-executed and compared with its saved outputs by nbval.
#   scripts/test.sh              all of it (what CI runs)
#   scripts/test.sh --quick      lint and the fast unit tests (those not marked slow)
#   scripts/test.sh --unit       lint and every unit test
#   scripts/test.sh --notebooks  notebooks only
#   scripts/test.sh --narrow-isa the notebooks again, with torch's, MKL's and oneDNN's kernels
#                                narrowed to a CPU without AVX: the saved outputs must hold on
#                                any CPU (add --unit or --quick to run those tests so instead)
#   add --dry-run to any of them to print the commands without running them (nor installing)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: scripts/test.sh [--quick | --unit | --notebooks] [--narrow-isa] [--dry-run] [--help]"
what=all; dry=0; narrow=0
for arg in "$@"; do
  case "$arg" in
    --quick|--unit|--notebooks)
      if [ "$what" != all ]; then
        echo "error: give one of --quick, --unit and --notebooks, not --$what and $arg" >&2
        echo "$usage" >&2; exit 2
      fi
      what="${arg#--}" ;;
    --narrow-isa) narrow=1 ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "error: unknown option $arg" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done

run() {  # print the command, quoted as the shell would read it; run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$dry" = 1 ] || "$@"
}

if [ "$dry" = 0 ]; then source "$ROOT/scripts/env.sh" || exit 1; fi  # stops if setup failed
source "$ROOT/scripts/ci_env.sh"
cd "$ROOT"
if [ "$narrow" = 1 ]; then  # what another machine computes: no AVX in torch, BLAS or oneDNN
  [ "$what" = all ] && what=notebooks  # the saved outputs are what a narrower CPU could change
  echo "== kernels narrowed to a CPU without AVX (torch: default, MKL: SSE4.2, oneDNN: SSE4.1)"
  for setting in ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL_CBWR=COMPATIBLE \
                 ONEDNN_MAX_CPU_ISA=SSE41; do
    printf '+ export %s\n' "$setting"; export "${setting?}"
  done
  if [ "$dry" = 0 ]; then
    echo "[narrow] torch's kernels: $(python -c 'import torch
print(torch.backends.cpu.get_cpu_capability())')"
  fi
fi
status=0
start=$(date +%s)
# Where writing bytecode is turned off (PYTHONDONTWRITEBYTECODE, as on some CI machines), every
# process the suite starts compiled course_lib's modules again, about 0.2 s of CPU each
echo "== course_lib compiled once, for every process the suite starts"
run python -m compileall -q course_lib || status=1

if [ "$what" != notebooks ]; then
  echo "== lint (ruff)"
  run ruff check course_lib tests scripts site || status=1
  echo "== installed packages against what each declares (pip check)"
  run python -m pip check || status=1
  chromium="${COURSE_CHROMIUM:-/usr/bin/chromium}"
  if [ -x "$chromium" ]; then
    echo "[browser] $chromium found: the JupyterLab browser test (tests/browser) runs with them"
  else
    echo "[browser] SKIPPED: no Chromium at $chromium, so the JupyterLab browser test does not" \
         "run (apt-get install chromium, or set COURSE_CHROMIUM)"
  fi
fi
if [ "$what" != unit ] && [ "$what" != quick ]; then
  run python scripts/check_notebook.py notebooks/[0-9][0-9]*_*.ipynb || status=1
fi

# One pytest session on four test processes (two cores, both kept busy: a test that waits for
# launched processes to start, or for a deadlock's timeout, leaves the CPU to the others; four
# took 488 s where three took 508). A file, or a notebook, stays on one process: a module's
# shared launch runs once, a notebook's cells run in order in one kernel. Files are handed out
# in the order tests/conftest.py gives them, longest first.
pytest_args=(-q -p no:cacheprovider -n 4 --dist loadfile --no-loadscope-reorder)
nbval_args=(--nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg
            --nbval-cell-timeout=300)
case "$what" in
  quick)     echo "== fast unit tests (those not marked slow)"  # the marker: pyproject.toml
             run python -m pytest tests "${pytest_args[@]}" -m "not slow" || status=1 ;;
  unit)      echo "== unit tests"
             run python -m pytest tests "${pytest_args[@]}" || status=1 ;;
  notebooks) echo "== notebooks (nbval: every cell re-run, every text output compared)"
             run python -m pytest notebooks "${pytest_args[@]}" "${nbval_args[@]}" || status=1 ;;
  all)       echo "== unit tests, and the notebooks under nbval (every cell re-run, every" \
                  "text output compared)"
             run python -m pytest tests notebooks "${pytest_args[@]}" "${nbval_args[@]}" \
               || status=1 ;;
esac

if [ "$dry" = 1 ]; then echo "scripts/test.sh: dry run, nothing was run"; exit 0; fi
echo "[time] scripts/test.sh took $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then echo "scripts/test.sh: FAILED"; exit "$status"; fi
echo "scripts/test.sh: all passed"
