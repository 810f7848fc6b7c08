#!/usr/bin/env bash
# The H200 runtime run (docs/measurements/runtime-h200.md): the graphed runtime, the fresh load and
# Inductor's autotuning options, on the 28-layer bf16 package of pipeline.h200.yaml.
#
#   benchmarks/h200_runtime.sh start   # start every phase in its own session, wait, collect
#   benchmarks/h200_runtime.sh wait    # a later call on the same warm machine: wait, collect
#   benchmarks/h200_runtime.sh status  # what ran, what is running
#   LAYA_RUNTIME_DRY=1 benchmarks/h200_runtime.sh start   # the same phases on the CPU, tiny model
#
# The phases may take longer than a remote shell with a time limit lives, so `start` runs
# them under setsid (they outlive the shell) and waits up to WAIT_S seconds; call `wait`
# again after each return until it prints "state: done".  Each
# phase has its own log, exit status and time limit; a failing phase does not stop the
# phases that do not need it, and every `start`/`wait` copies what exists so far to $OUT
# (at most 8 files).  Phases, most important first:
#   build     doit aoti_package (checkpoint, export, the CUDA package; ~2-4 min compile)
#   verify    doit verify: parity, the graphed runner vs eager.pt and replay vs plain (bit for
#             bit), the fresh-load breakdown (import, sha256, ISA answer, load, capture, 1st call)
#   fresh     fresh processes to their first answer: 2 with the preload, 2 more loading without
#             Inductor (runtime.load_package(loader="direct")), 1 without the preload (does the
#             image's load crash still need `import tilelang`?), 1 each with lighter candidate
#             preloads (PRELOAD_CANDIDATES, default "tvm_ffi cuda.bindings.runtime")
#   runner    1x128x3 and 7x256x4: replay == plain, latency of replay / runner / plain calls
#   latency   doit latency with eager_amp, eager_bf16, package, package_graphed (FULL_LATENCY=1
#             adds compiled_bf16: ~200 s of compilation)
#   autotune  the same export packaged with max_autotune (GEMM) and, if time is left,
#             coordinate_descent_tuning: compile time and runner latency against the default
#             (skipped when less than AUTOTUNE_NEEDS_S of the DEADLINE_S budget is left)
# The whole sequence stops starting phases DEADLINE_S seconds after `start` (default 1380 s,
# 23 minutes).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=artifacts/h200-runtime
WAIT_S=${WAIT_S:-540}
OUT=${OUT:-$ROOT/$STATE/out}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
PY=${PYTHON:-python3}

if [ "${LAYA_RUNTIME_DRY:-0}" = 1 ]; then   # CPU: the tiny default model, float32 package only
  BASE=pipeline.yaml VERSION=0.1.0-dry BUILD=cpu-float32 TARGET=cpu
  SHAPES=1x32x2,4x128x8 AUTOTUNE_NEEDS_S=${AUTOTUNE_NEEDS_S:-60}
  RUNNER_TIMING='{"warmup": 1, "min_run_time_s": 0.1}'
  AUTOTUNE_CONFIGS=('{"max_autotune": true}' '{"coordinate_descent_tuning": true}')
else
  BASE=pipeline.h200.yaml VERSION=0.1.0-h200 BUILD=cuda-bfloat16 TARGET=cuda
  SHAPES=1x128x3,7x256x4 AUTOTUNE_NEEDS_S=${AUTOTUNE_NEEDS_S:-420}
  RUNNER_TIMING='{"warmup": 10, "min_run_time_s": 1.0}'
  AUTOTUNE_CONFIGS=('{"max_autotune": true, "max_autotune_gemm_backends": "ATEN,TRITON"}'
                    '{"coordinate_descent_tuning": true}')
fi
DEADLINE_S=${DEADLINE_S:-1380}
V=artifacts/$VERSION

phases() {  # runs detached; every phase: $STATE/<name>.log, .rc, .s
  local t0=$SECONDS cfg=$STATE/pipeline.yaml latcfg=$STATE/pipeline.latency.yaml
  phase() {  # phase NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    if [ $((SECONDS - t0 + 30)) -ge "$DEADLINE_S" ]; then
      echo "skipped: deadline" > "$STATE/$name.rc"; return 1
    fi
    echo "$name" > "$STATE/current"
    local s=$SECONDS
    timeout --kill-after=20 "$limit" "$@" > "$STATE/$name.log" 2>&1
    local rc=$?
    echo $rc > "$STATE/$name.rc"; echo $((SECONDS - s)) > "$STATE/$name.s"
    return $rc
  }
  local sets=(--set "version=\"$VERSION\"")
  if [ "${LAYA_RUNTIME_DRY:-0}" = 1 ]; then
    sets+=(--set 'package.targets=["cpu"]' --set 'export.targets={"cpu": ["float32"], "cuda": []}'
           --set 'verify.timing={"cpu": {"warmup": 0, "min_run_time_s": 0.05}}'
           --set 'latency.timing={"cpu": {"warmup": 0, "min_run_time_s": 0.05}}')
  fi
  $PY benchmarks/runtime_bench.py derive-config "$BASE" "$cfg" "${sets[@]}" > "$STATE/config.log" 2>&1
  local variants='["eager_amp", "eager_bf16", "package", "package_graphed"]'
  [ "${FULL_LATENCY:-0}" = 1 ] && variants='["eager_amp", "eager_bf16", "compiled_bf16", "package", "package_graphed"]'
  $PY benchmarks/runtime_bench.py derive-config "$cfg" "$latcfg" --set "latency.variants=$variants" >> "$STATE/config.log" 2>&1
  local record=$V/aoti_package/$BUILD/aoti_package.json inputs=$V/model/inputs.pt
  local buckets preload
  buckets=$($PY -c "import yaml,json,sys; d=yaml.safe_load(open('$cfg')); print(json.dumps(d.get('runtime',{}).get('buckets',{}).get('$TARGET',[])))" 2>>"$STATE/config.log")
  preload=$($PY -c "import yaml; d=yaml.safe_load(open('$cfg')); print(','.join(d['verify']['preload']['$TARGET']))" 2>>"$STATE/config.log")
  [ -z "$buckets" ] && buckets='[]'

  if phase build 1500 $PY -m doit config="$cfg" aoti_package; then
    phase verify 900 $PY -m doit config="$cfg" verify
    phase fresh 400 $PY benchmarks/runtime_bench.py fresh-load "$record" --inputs "$inputs" \
      --buckets "$buckets" --preload "$preload" --repeat 2 --out "$STATE/fresh_load.json"
    phase fresh_direct 300 $PY benchmarks/runtime_bench.py fresh-load "$record" --inputs "$inputs" \
      --buckets "$buckets" --preload "$preload" --loader direct --repeat 2 --out "$STATE/fresh_load_direct.json"
    phase fresh_nopreload 200 $PY benchmarks/runtime_bench.py fresh-load "$record" --inputs "$inputs" \
      --buckets "$buckets" --preload "" --repeat 1 --timeout 150 --out "$STATE/fresh_load_nopreload.json"
    local m=0
    for candidate in ${PRELOAD_CANDIDATES:-tvm_ffi cuda.bindings.runtime}; do  # lighter than tilelang?
      m=$((m + 1))
      phase fresh_preload$m 200 $PY benchmarks/runtime_bench.py fresh-load "$record" --inputs "$inputs" \
        --buckets "$buckets" --preload "$candidate" --repeat 1 --timeout 150 --out "$STATE/fresh_load_preload$m.json"
    done
    phase runner 400 $PY benchmarks/runtime_bench.py runner "$record" --inputs "$inputs" --shapes "$SHAPES" \
      --timing "$RUNNER_TIMING" --preload "$preload" --out "$STATE/runner_default.json"
    phase latency 900 $PY -m doit config="$latcfg" latency
    local i=0
    for configs in "${AUTOTUNE_CONFIGS[@]}"; do
      i=$((i + 1))
      if [ $((SECONDS - t0 + AUTOTUNE_NEEDS_S)) -ge "$DEADLINE_S" ]; then
        echo "skipped: less than ${AUTOTUNE_NEEDS_S}s left" > "$STATE/autotune$i.rc"; continue
      fi
      echo "$configs" > "$STATE/autotune$i.configs"
      local left=$((DEADLINE_S - (SECONDS - t0) - 60))
      if phase autotune$i "$left" $PY benchmarks/runtime_bench.py package "$V/export/$BUILD" \
          "$STATE/autotune$i" --target "$TARGET" --inductor-configs "$configs"; then
        phase autotune${i}_runner 300 $PY benchmarks/runtime_bench.py runner "$STATE/autotune$i/aoti_package.json" \
          --inputs "$inputs" --shapes "$SHAPES" --timing "$RUNNER_TIMING" --preload "$preload" \
          --out "$STATE/runner_autotune$i.json"
      fi
    done
  fi
  echo done > "$STATE/current"
  touch "$STATE/done"
}

collect() {
  mkdir -p "$OUT"
  local status=$STATE/status.txt
  {
    echo "version $VERSION build $BUILD started $(cat $STATE/started 2>/dev/null) now $(date -u +%FT%TZ)"
    for f in "$STATE"/*.rc; do
      [ -e "$f" ] || continue
      local n; n=$(basename "$f" .rc)
      echo "$n: rc $(cat "$f") in $(cat "$STATE/$n.s" 2>/dev/null || echo -) s"
    done
    echo "current: $(cat $STATE/current 2>/dev/null || echo -)"
  } > "$status"
  cp "$status" "$OUT/status.txt"
  for f in fresh_load fresh_load_direct runner_default; do [ -f "$STATE/$f.json" ] && cp "$STATE/$f.json" "$OUT/"; done
  cp $V/latency/$TARGET/latency.md "$OUT/" 2>/dev/null   # one latency record per target
  cp $V/verify/$BUILD/verify.json "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1
  # everything else (records, logs, the autotune and no-preload results), without packages
  tar -czf "$OUT/records.tgz" --exclude='*.pt2' --exclude='*.pt' --exclude='*.safetensors' \
      --exclude='out' --ignore-failed-read "$STATE" \
      $(ls -d $V/model/model.json $V/export/*/export.json $V/aoti_package $V/verify $V/latency 2>/dev/null) \
      > /dev/null 2>&1
  cat "$status"
}

wait_done() {
  local deadline=$((SECONDS + WAIT_S))
  while [ $SECONDS -lt $deadline ]; do
    [ -f "$STATE/done" ] && { echo "state: done"; return 0; }
    if ! kill -0 "$(cat $STATE/pid 2>/dev/null || echo 0)" 2>/dev/null; then
      echo "state: no run in progress (a fresh machine? then: start)"; return 1
    fi
    sleep 2
  done
  echo "state: running ($(cat $STATE/current 2>/dev/null)) after ${WAIT_S}s: call wait again now"
  tail -3 "$STATE/$(cat $STATE/current 2>/dev/null).log" 2>/dev/null
}

case "${1:-}" in
  start)
    rm -rf "$STATE"; mkdir -p "$STATE"
    date -u +%FT%TZ > "$STATE/started"
    export -f phases
    export STATE VERSION BUILD TARGET SHAPES RUNNER_TIMING AUTOTUNE_NEEDS_S DEADLINE_S V PY BASE
    AUTOTUNE_LIST=$(printf '%s\n' "${AUTOTUNE_CONFIGS[@]}")
    export AUTOTUNE_LIST
    setsid bash -c 'mapfile -t AUTOTUNE_CONFIGS <<< "$AUTOTUNE_LIST"; phases' \
      > "$STATE/phases.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pid"
    wait_done; collect ;;
  wait)
    wait_done; collect ;;
  status)
    collect ;;
  *)
    echo "usage: $0 start|wait|status" >&2; exit 2 ;;
esac
