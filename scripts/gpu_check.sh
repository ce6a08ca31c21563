#!/usr/bin/env bash
# The course on a GPU machine: the training entry point on NCCL (one process per GPU), notebook
# 08's overlap against torch DDP (2 GPUs or more), the file exercises' reference answers on one
# GPU, Gloo's collectives on CUDA tensors with 2-4 ranks sharing one GPU, NCCL's refusal of more
# ranks than GPUs, ZeRO-3 against torch's fully_shard, and the memory benchmark with
# torch.cuda.max_memory_allocated. Prints the figures the README records.
#   scripts/gpu_check.sh [OUT_DIR]       (default OUT_DIR: .bench/gpu)
# Uses the machine's own python3 and torch (PYTHON=... to choose), so it also runs where
# scripts/env.sh cannot install (a cluster node without internet).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage="usage: scripts/gpu_check.sh [OUT_DIR] [--help]"
case "${1:-}" in
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
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

echo "== notebook 08 on NCCL: buckets after backward, overlap from hooks, torch DDP"
if [ "$gpus" -lt 2 ]; then
  echo "[gpu] skipped: one process has no communication to overlap (needs 2 GPUs or more)"
else
  "$PY" - "$gpus" "$OUT/overlap.json" <<'PY'
import json, statistics, sys
from course_lib.lessons.timeline import overlap_summary
from course_lib.lessons.timeline_plot import backward_end_s, first_comm_start_s
from course_lib.runtime.launch import launch
run = launch("course_lib.demos.bucket_sweep", nproc=int(sys.argv[1]), timeout_s=600, quiet=True,
             args=["--strategies", "bucketed,overlap,ddp", "--sweep-mb", "", "--compute-only",
                   "--batch", "1024", "--rounds", "6", "--steps", "5"])
json.dump(run.result, open(sys.argv[2], "w"))
rows = {r["label"]: r for r in run.result["rows"]}
for label, r in rows.items():
    q1, median, q3 = statistics.quantiles(r["step_times_s"], n=4)
    s = overlap_summary(r["timeline"])
    print(f"[gpu] {label:>12}: median step {median * 1e3:.2f} ms (quartiles {q1 * 1e3:.2f} to "
          f"{q3 * 1e3:.2f}), backward {s['backward_s'] * 1e3:.2f} ms, communication after it "
          f"{s['exposed_s'] * 1e3:.2f} ms (last step)")
steps = {label: r["median_step_s"] for label, r in rows.items()}
waited = steps["bucketed"] - steps["compute only"]  # what buckets after backward add
for label in ("overlap", "ddp"):
    saved = steps["bucketed"] - steps[label]
    print(f"[gpu] {label}: {saved * 1e3:+.2f} ms per step against buckets after backward, "
          f"which add {waited * 1e3:.2f} ms to compute alone ({100 * saved / waited:.0f} % hidden)"
          if waited > 0 else f"[gpu] {label}: buckets after backward added nothing to measure")
events = rows["overlap"]["timeline"]  # launch times are the CPU's, ahead of the GPU
print(f"[gpu] overlap launched bucket 0 at {first_comm_start_s(events) * 1e3:.2f} ms, backward "
      f"ended at {backward_end_s(events) * 1e3:.2f} ms (last step)")
for label in ("bucketed", "overlap"):
    assert rows[label]["same_as_ddp"], (label, rows[label]["max_difference_to_ddp"])
    assert rows[label]["replicas_bitwise_equal"], label
PY
fi

echo "== the file exercises' reference answers under torchrun: one process on GPU 0 (NCCL)"
ref="$OUT/reference"
"$PY" scripts/reference_files.py "$ref/workspace" >/dev/null
for file in "$ref"/workspace/*.py; do
  name="$(basename "$file")"
  if (cd "$ref" && CUDA_VISIBLE_DEVICES=0 timeout 300 "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node 1 "workspace/$name" > "$ref/$name.log" 2>&1); then
    echo "[gpu] $name on 1 process: ran, last line: $(tail -n 1 "$ref/$name.log")"
  else
    echo "[gpu] $name on 1 process: FAILED, see $ref/$name.log:"; tail -n 5 "$ref/$name.log"
    failed=1
  fi
done
[ "${failed:-0}" = 0 ] || { echo "error: a reference answer failed on the GPU" >&2; exit 1; }

echo "== Gloo on CUDA tensors: 2, 3 and 4 ranks sharing GPU 0, each collective against the CPU"
for n in 2 3 4; do
  COURSE_BACKEND=gloo "$PY" -m course_lib.runtime.launch --nproc "$n" \
    course_lib.demos.cuda_gloo --device cuda | grep -F '[gpu]'
done

echo "== NCCL asked for more ranks than GPUs: refused in one line, before any rank starts"
too_many=$((gpus + 1))
if refusal="$(COURSE_BACKEND=nccl "$PY" -m course_lib.runtime.launch --nproc "$too_many" \
              course_lib.demos.hello 2>&1)"; then
  echo "error: NCCL with $too_many ranks on $gpus GPU(s) was not refused" >&2; exit 1
fi
[ "$(printf '%s\n' "$refusal" | wc -l)" -eq 1 ] \
  || { echo "error: the refusal took more than one line:" >&2; echo "$refusal" >&2; exit 1; }
echo "[gpu] $too_many ranks on $gpus GPU(s): $refusal"

echo "== ZeRO-3 against torch's fully_shard on the GPU(s): $gpus process(es), one per GPU"
"$PY" scripts/bench_fully_shard.py --nproc "$gpus" --quick | tee "$OUT/fully_shard.txt"

echo "== memory benchmark on cuda"
"$PY" scripts/bench_memory.py --device cuda --out "$OUT"
echo "== done: figures in $OUT"
