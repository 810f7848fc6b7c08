#!/usr/bin/env bash
# The serving process on a GPU machine (docs/measurements/serving-start.md, docs/guides/serving.md):
#
#   benchmarks/h200_serving.sh RECORD INPUTS      # an aoti_package.json of a CUDA build, its inputs.pt
#
# In the project root, TileLang importable.  Phases, each with its own log and JSON in $OUT:
#   preload   each candidate preload in a fresh process: does the package load and answer
#             (CANDIDATES, default none,lib:tvm_ffi,tvm_ffi,tilelang)
#   first     fresh processes side by side, ROUNDS rounds: import torch alone, runtime.start,
#             open_build with every graph captured first (preload PRELOAD, default tilelang)
#   mixed     the runner's graphs beside another model, torch.compile max-autotune, allocations,
#             frees and cleared cuBLAS workspaces: with the capture as it is, then as it was before
#             the workspace fix (each in a process of its own; a crash is recorded with its signal)
#   tests     tests/stages/test_runtime_gpu.py (TESTS=no leaves them out: they build a package of their own)
# PHASES (default "preload first mixed tests") names the phases to run; MIXED (default "fixed unfixed")
# the mixed workload's variants.
set -u
cd "$(dirname "$0")/.."
RECORD=${1:?usage: h200_serving.sh RECORD INPUTS}
INPUTS=${2:?usage: h200_serving.sh RECORD INPUTS}
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/laya-serving}
PRELOAD=${PRELOAD:-tilelang}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log=$OUT/serving.log
PHASES=" ${PHASES:-preload first mixed tests} "
[ "${TESTS:-yes}" = no ] && PHASES=${PHASES/ tests / }
for p in $PHASES; do
  case "$p" in preload|first|mixed|tests) ;; *) echo "h200_serving.sh: unknown phase '$p' in PHASES (preload, first, mixed, tests; space-separated)" >&2; exit 2 ;; esac
done
for v in ${MIXED:-fixed unfixed}; do
  case "$v" in fixed|unfixed) ;; *) echo "h200_serving.sh: unknown variant '$v' in MIXED (fixed, unfixed)" >&2; exit 2 ;; esac
done
phase() { [[ "$PHASES" == *" $1 "* ]]; }
probe() { "$PY" benchmarks/serving_probe.py "$@"; }
if phase preload; then
s=$SECONDS
probe preload "$RECORD" "$INPUTS" --candidates "${CANDIDATES:-none,lib:tvm_ffi,tvm_ffi,tilelang}" \
  --out "$OUT/preload.json" > "$OUT/preload.log" 2>&1
echo "preload rc $? in $((SECONDS - s)) s" | tee -a "$log"
grep '^{"preload' "$OUT/preload.log" | cut -c1-300 | tee -a "$log"
fi
if phase first; then
s=$SECONDS
probe first "$RECORD" "$INPUTS" --rounds "${ROUNDS:-3}" --preload "$PRELOAD" --out "$OUT/first.json" \
  > "$OUT/first.log" 2>&1
echo "first rc $? in $((SECONDS - s)) s" | tee -a "$log"
grep '^{"round' "$OUT/first.log" | cut -c1-400 | tee -a "$log"
fi
phase mixed && for variant in ${MIXED:-fixed unfixed}; do
  s=$SECONDS
  flag=(); [ "$variant" = unfixed ] && flag=(--without-workspace-fix)
  probe mixed "$RECORD" "$INPUTS" --preload "$PRELOAD" "${flag[@]}" --out "$OUT/mixed-$variant.json" \
    > "$OUT/mixed-$variant.log" 2>&1
  echo "mixed ($variant) rc $? in $((SECONDS - s)) s" | tee -a "$log"
  grep '^{"step\|^{"done' "$OUT/mixed-$variant.log" | tee -a "$log"
done
if phase tests; then
  s=$SECONDS
  "$PY" -m pytest tests/stages/test_runtime_gpu.py -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests rc $? in $((SECONDS - s)) s: $(tail -1 "$OUT/tests.log")" | tee -a "$log"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__)" >> "$log" 2>&1
