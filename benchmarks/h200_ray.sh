#!/usr/bin/env bash
# The CUDA package built through a Ray worker (docs/measurements/cache.md, "On a GPU machine").
#
#   benchmarks/h200_ray.sh            # in the project root of a GPU machine; TileLang and Ray importable
#   RAY="python3 -m ray.scripts.scripts" benchmarks/h200_ray.sh   # Ray importable, its `ray` command not installed
#
# On one GPU machine: a Ray head (no CPUs of its own) and a worker node that offers
# `laya_target:cuda-sm90` with its own copy of the project ($WORK/worker); then
#   1. `build`: a copy that sees no GPU (CUDA_VISIBLE_DEVICES=) runs
#      `doit config=pipeline.h200.yaml aoti_package:cuda-bfloat16` and then `verify` with
#      `executor: ray` and a folder cache ($WORK/cache): export, package and verify run on the worker;
#   2. `warm`: a fresh copy that sees the GPU, no executor, the same cache: `aoti_package` (all fetched);
#      it runs before the build copy's `verify`, which takes the worker for a minute;
#   3. `again`: `verify` in the build copy once more (a verification is never answered from the cache).
# Each step's time, exit status and the cache report go to $WORK/ray.log (and $OUT when set).
# If Ray refuses a second node on the machine, the head itself offers the resource.
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
WORK=${WORK:-/tmp/laya-ray}
PY=${PYTHON:-python3}
RAY=${RAY:-ray}
CONFIG=${CONFIG:-pipeline.h200.yaml}
VERSION=${VERSION:-0.1.0-h200}
RESOURCE=${RESOURCE:-laya_target:cuda-sm90}
PORT=${PORT:-6379}
OUT=${OUT:-$WORK/out}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
mkdir -p "$WORK" "$OUT"
log=$OUT/ray.log
: > "$log"
. benchmarks/copies.sh

for name in worker build warm; do copy "$name"; done
rm -rf "$WORK/cache" /tmp/ray-laya
base_path=${PYTHONPATH:-}
$RAY stop --force > /dev/null 2>&1
s=$SECONDS
$RAY start --head --node-ip-address=127.0.0.1 --port="$PORT" --num-cpus=0 --include-dashboard=false \
  --disable-usage-stats --temp-dir=/tmp/ray-laya > "$WORK/head.log" 2>&1
say "ray head rc $? in $((SECONDS - s)) s"
s=$SECONDS
LAYA_BUILD_WORKER_ROOT=$WORK/worker PYTHONPATH=$base_path $RAY start --address="127.0.0.1:$PORT" \
  --node-ip-address=127.0.0.1 --num-cpus="$(nproc)" --num-gpus=1 --resources="{\"$RESOURCE\": 1}" \
  --disable-usage-stats > "$WORK/worker.log" 2>&1
rc=$?
say "ray worker node rc $rc in $((SECONDS - s)) s"
if [ "$rc" != 0 ]; then  # one node: the head offers the resource
  $RAY stop --force > /dev/null 2>&1
  LAYA_BUILD_WORKER_ROOT=$WORK/worker PYTHONPATH=$base_path $RAY start --head --node-ip-address=127.0.0.1 \
    --port="$PORT" --num-cpus="$(nproc)" --num-gpus=1 --resources="{\"$RESOURCE\": 1}" --include-dashboard=false \
    --disable-usage-stats --temp-dir=/tmp/ray-laya > "$WORK/head.log" 2>&1
  rc=$?
  say "ray head with the resource (one node) rc $rc"
  [ "$rc" = 0 ] || { say "no cluster: $(tail -3 "$WORK/head.log")"; exit 1; }
fi
$RAY status --address="127.0.0.1:$PORT" >> "$log" 2>&1

step() {  # step NAME COPY ENV... -- DOIT-ARGS...
  local name=$1 copy=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local s=$SECONDS
  (cd "$WORK/$copy" && env "${envs[@]}" PYTHONPATH="$base_path:$WORK/$copy" LAYA_BUILD_CACHE_URL="$WORK/cache" \
    "$PY" -m doit config="$CONFIG" "$@") > "$WORK/$name.log" 2>&1
  local rc=$?
  say "$name: doit $* rc $rc in $((SECONDS - s)) s"
  grep -h "laya-build: cache:\|laya-build: warning\|Error" "$WORK/$name.log" | cut -c1-300 | tee -a "$log"
  if [ -f "$WORK/$copy/artifacts/.doit/cache/$VERSION.jsonl" ]; then
    cp "$WORK/$copy/artifacts/.doit/cache/$VERSION.jsonl" "$WORK/$name.cache.jsonl"
  fi
  return $rc
}
remote=(CUDA_VISIBLE_DEVICES= LAYA_BUILD_EXECUTOR=ray "LAYA_BUILD_RAY_ADDRESS=127.0.0.1:$PORT")
step build build "${remote[@]}" -- aoti_package:cuda-bfloat16
step warm warm LAYA_BUILD_CACHE_WRITE=no -- aoti_package
step verify build "${remote[@]}" -- verify
step again build "${remote[@]}" -- verify
for copy in build worker warm; do
  sha256sum "$WORK/$copy/artifacts/$VERSION/aoti_package/cuda-bfloat16/decision.pt2" 2>&1 | tee -a "$log"
done
for copy in build worker; do
  rec=$WORK/$copy/artifacts/$VERSION/verify/cuda-bfloat16/verify.json
  [ -f "$rec" ] && "$PY" - "$rec" <<'PYEOF' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[1], r.get("status"), "ran on", r.get("host", r.get("ran_on")), json.dumps(r.get("runner", {}))[:300])
PYEOF
done
$RAY stop --force > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
"$PY" -c "import torch, ray; print('torch', torch.__version__, 'ray', ray.__version__)" >> "$log" 2>&1
cp "$WORK"/*.log "$WORK"/*.jsonl "$OUT/" 2>/dev/null
echo "state: done" >> "$log"
