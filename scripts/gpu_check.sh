#!/usr/bin/env bash
# The course on a GPU machine: the training entry point on NCCL (one process per GPU) and the
# memory benchmark with torch.cuda.max_memory_allocated. Prints the figures the README records.
#   scripts/gpu_check.sh [OUT_DIR]       (default OUT_DIR: .bench/gpu)
# Uses the machine's own python3 and torch (PYTHON=... to choose), so it also runs where
# scripts/env.sh cannot install (a cluster node without internet).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: scripts/gpu_check.sh [OUT_DIR] [--help]"
case "${1:-}" in
  -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
  -*) echo "error: unknown option $1" >&2; echo "$usage" >&2; exit 2 ;;
esac
if [ "$#" -gt 1 ]; then echo "error: one OUT_DIR at most, got $*" >&2; echo "$usage" >&2; exit 2; fi
OUT="${1:-$ROOT/.bench/gpu}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
cd "$ROOT"
# the course package from this checkout, in editable mode (no download: setuptools is at hand)
"$PY" -m pip install --quiet --no-deps --no-build-isolation -e "$ROOT" \
  || { echo "error: could not install the course package with $PY (pip install -e .)" >&2; exit 1; }
mkdir -p "$OUT"
count='import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)'
gpus="$("$PY" -c "$count" 2>/dev/null)" \
  || { echo "error: $PY cannot import torch; set PYTHON=/path/to/python-with-torch" >&2; exit 1; }
if [ "$gpus" -lt 1 ]; then
  echo "error: no CUDA GPU visible to $PY; run this on a GPU machine" \
       "(the CPU path is scripts/test.sh)" >&2
  exit 1
fi
echo "== GPU check, $(date -u +%Y-%m-%d)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" - <<'PY'
from course_lib.runtime.environment import environment_report, print_report
print_report(environment_report(nproc=1))
PY

echo "== hello on $gpus process(es), one per GPU"
"$PY" -m course_lib.runtime.launch --nproc "$gpus" course_lib.demos.hello

echo "== training entry point: tiny transformer, NCCL, $gpus process(es)"
for sync in ddp ring overlap; do
  "$PY" -m course_lib.train --nproc "$gpus" --accum-steps 2 --steps 60 --sync "$sync" \
    --metrics "$OUT/train_$sync.jsonl" --log-every 20 --timeout 300
  "$PY" - "$OUT/train_$sync.jsonl" "$sync" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
times = [r["step_time_s"] for r in rows[5:]] or [r["step_time_s"] for r in rows]
print(f"[gpu] sync {sys.argv[2]}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} "
      f"in {len(rows)} steps, median step {statistics.median(times) * 1e3:.2f} ms")
assert rows[-1]["loss"] < rows[0]["loss"], "the loss did not fall"
PY
done

echo "== memory benchmark on cuda"
"$PY" scripts/bench_memory.py --device cuda --out "$OUT"
echo "== done: figures in $OUT"
