#!/usr/bin/env bash
# The large CUDA package from a warm cache on a GPU machine (docs/measurements/cache.md).
#
#   benchmarks/h200_cache.sh          # in the project root of a GPU machine; TileLang importable
#
# 1. `cold`: a copy of the project builds `doit config=pipeline.h200.yaml aoti_package` with a
#    folder cache ($WORK/cache) it writes;
# 2. `warm1`, `warm2`: two fresh copies run the same command with the cache read-only: every
#    stage fetched, none built.  Their time is the goal's (≤ 10 s).
# Each step's time, exit status and cache lines go to $OUT/cache.log, the packages' sha256 after;
# the steps' logs and cache reports to $OUT/logs.tar.gz.
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
WORK=${WORK:-/tmp/laya-cache}
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-pipeline.h200.yaml}
VERSION=${VERSION:-0.1.0-h200}
OUT=${OUT:-$WORK/out}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
mkdir -p "$WORK" "$OUT"
log=$OUT/cache.log
: > "$log"
. benchmarks/copies.sh
rm -rf "${WORK:?}/cache"
for name in cold warm1 warm2; do copy "$name"; done
step() {  # step COPY ENV...
  local copy=$1; shift
  local s=$EPOCHREALTIME
  (cd "$WORK/$copy" && env "$@" PYTHONPATH="${PYTHONPATH:-}:$WORK/$copy" LAYA_BUILD_CACHE_URL="$WORK/cache" \
    "$PY" -m doit config="$CONFIG" aoti_package) > "$WORK/$copy.log" 2>&1
  local rc=$?
  say "$copy: doit aoti_package rc $rc in $(awk "BEGIN {printf \"%.2f\", $EPOCHREALTIME - $s}") s"
  grep -h "laya-build: cache:\|laya-build: warning\|Error" "$WORK/$copy.log" | cut -c1-300 | tee -a "$log"
  cp "$WORK/$copy/artifacts/.doit/cache/$VERSION.jsonl" "$WORK/$copy.cache.jsonl" 2>/dev/null
  return $rc
}
step cold LAYA_BUILD_CACHE_WRITE=yes || { say "the cold build failed: $(tail -5 "$WORK/cold.log")"; exit 1; }
step warm1 LAYA_BUILD_CACHE_WRITE=no
step warm2 LAYA_BUILD_CACHE_WRITE=no
for copy in cold warm1 warm2; do
  sha256sum "$WORK/$copy/artifacts/$VERSION/aoti_package/cuda-bfloat16/decision.pt2" 2>&1 | tee -a "$log"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__)" >> "$log" 2>&1
tar -C "$WORK" -czf "$OUT/logs.tar.gz" cold.log warm1.log warm2.log $(cd "$WORK" && ls ./*.cache.jsonl 2>/dev/null)
echo "state: done" >> "$log"
