#!/usr/bin/env bash
# The GPU packaging run of pipeline.h200.yaml on an H200 (docs/measurements/aoti-h200.md).
#
#   benchmarks/h200_aoti.sh start   # start the pipeline in its own session, wait, collect
#   benchmarks/h200_aoti.sh wait    # a later call on the same warm machine: wait, collect
#   TASKS="aoti_package verify" ...  # other doit tasks than "aoti_package verify latency"
#
# Generating, exporting, packaging (28 layers), verifying in a fresh process and measuring
# latency may take longer than a remote shell with a time limit lives, so `start` runs
#   doit config=pipeline.h200.yaml aoti_package verify latency
# under setsid (it outlives the shell that started it) and then waits up to
# WAIT_S seconds; `wait` waits again.  Either copies the records, logs and the latency table
# (one per target: `latency/<target>/`) to $OUT (at most 8 files come back).  Then, when
# GPU_TESTS=1, the GPU kernel tests run after the pipeline, never beside it (they would
# disturb the latency numbers).
set -u
cd "$(dirname "$0")/.."
STATE=artifacts/h200-run
WAIT_S=${WAIT_S:-540}
TASKS=${TASKS:-aoti_package verify latency}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

collect() {
  local v=artifacts/0.1.0-h200
  cp "$STATE/log" "$OUT/pipeline.log" 2>/dev/null
  [ -f "$STATE/tests.log" ] && cp "$STATE/tests.log" "$OUT/gpu-tests.log"
  tar -czf "$OUT/records.tgz" --ignore-failed-read \
      $(ls -d $v/model/model.json $v/export/*/export.json $v/aoti_package/*/*.json \
        $v/aoti_package/*/*.log $v/verify/*/*.json $v/verify/*/*.log $v/latency/*/* 2>/dev/null \
        | grep -v -E '\.(pt|pt2)$') 2>/dev/null
  cp $v/latency/*/latency.md "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1
  echo "state: $(cat $STATE/rc 2>/dev/null || echo running) tests: $(cat $STATE/tests.rc 2>/dev/null || echo -)"
}

wait_done() {
  local deadline=$((SECONDS + WAIT_S))
  while [ $SECONDS -lt $deadline ]; do
    if [ -f "$STATE/done" ]; then return 0; fi
    if ! kill -0 "$(cat $STATE/pid 2>/dev/null || echo 0)" 2>/dev/null; then
      echo "no run in progress (a fresh machine?)"; return 1
    fi
    sleep 2
  done
  echo "still running after ${WAIT_S}s"; tail -5 "$STATE/log"
}

case "${1:-}" in
  start)
    rm -rf "$STATE"; mkdir -p "$STATE"
    setsid bash -c "
      python -m doit config=pipeline.h200.yaml $TASKS > $STATE/log 2>&1
      echo \$? > $STATE/rc
      if [ \"${GPU_TESTS:-0}\" = 1 ]; then
        python -m pytest tests/kernels -q -p no:cacheprovider -k gpu > $STATE/tests.log 2>&1
        echo \$? > $STATE/tests.rc
      fi
      touch $STATE/done" > /dev/null 2>&1 < /dev/null &
    echo $! > "$STATE/pid"
    wait_done; collect ;;
  wait)
    wait_done; collect ;;
  *)
    echo "usage: $0 start|wait" >&2; exit 2 ;;
esac
