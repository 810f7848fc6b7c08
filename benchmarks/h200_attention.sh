#!/usr/bin/env bash
# The CUDA package with `export.attention.cuda: sdpa` and with `varlen`, side by side on a GPU
# machine (docs/measurements/runtime-h200.md, "Attention without masks").
#
#   PHASE=build benchmarks/h200_attention.sh     # then, on the same machine:
#   PHASE=repro benchmarks/h200_attention.sh
#   PHASE=compare benchmarks/h200_attention.sh   # on its own
#
# In the project root, TileLang importable.  Copies of the project under $WORK (default
# /tmp/laya-attention), each with its own artifacts:
#   build  `sdpa`: `doit config=pipeline.h200.yaml aoti_package:cuda-bfloat16` (its committed
#          tuning file) and, at the same time, `varlen`: the same with `export.attention.cuda:
#          varlen` and no tuning file (Inductor tunes afresh and writes the build's tuning.json);
#          then `doit verify:cuda-bfloat16` of `varlen` and both packages' latency side by side
#          (benchmarks/package_latency.py).
#   repro  `rep1`, `rep2`: copies of `varlen`'s artifacts with its tuning.json as the tuning file
#          and the package removed: two `aoti_package:cuda-bfloat16` at the same time, their bytes
#          compared; `verify:cuda-bfloat16` of rep1; the latency of sdpa, varlen (freely tuned) and
#          rep1 (the tuning file) side by side; then benchmarks/h200_serving.sh on rep1's package
#          (PHASES, default "first mixed").
#   compare  `sdpa` and `varlen` built at the same time as in `build`; their latency side by side
#          with a kernel profile of each (PROFILE replays, default 20); the first answer of sdpa's
#          package (SERVING_ROUNDS, default 2); `verify:cuda-bfloat16` of varlen; the GEMM probe's
#          cuBLAS, L2 and batched rows (benchmarks/gemm_probe.py).
# Stops starting steps DEADLINE_S seconds after its start (default 560).  Its log and JSON go to
# $OUT (default $WORK/out).
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
WORK=${WORK:-/tmp/laya-attention}
PY=${PYTHON:-python3}
VERSION=${VERSION:-0.1.0-h200}
BUILD=cuda-bfloat16
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-$WORK/out}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
mkdir -p "$WORK" "$OUT"
log=$OUT/attention-${PHASE:?set PHASE=build, repro or compare}.log
: > "$log"
. benchmarks/copies.sh
config() {  # config NAME TUNING: pipeline.h200.yaml with varlen attention and TUNING (a path, or none)
  "$PY" - "$WORK/$1/pipeline.h200.yaml" "$WORK/$1/pipeline.varlen.yaml" "$2" <<'PYEOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
doc["export"]["attention"] = {"cuda": "varlen"}
doc["package"]["tuning"] = {} if sys.argv[3] == "none" else {"cuda-bfloat16": sys.argv[3]}
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
}
pkg() { echo "$WORK/$1/artifacts/$VERSION/aoti_package/$BUILD"; }
latency() {  # latency OUTFILE NAME...: the named copies' packages side by side
  local out=$1; shift
  local args=(); for n in "$@"; do args+=("$n=$(pkg "$n")/decision.pt2"); done
  local s=$SECONDS
  (cd "$WORK/sdpa" && PYTHONPATH="${PYTHONPATH:-}:$WORK/sdpa" "$PY" benchmarks/package_latency.py \
    "artifacts/$VERSION/export/$BUILD" "artifacts/$VERSION/model/inputs.pt" "${args[@]}" \
    --rounds "${ROUNDS:-4}" --preload lib:tvm_ffi ${PROFILE:+--profile "$PROFILE"} --out "$out") > "$WORK/${out##*/}.log" 2>&1
  say "latency ($*) rc $? in $((SECONDS - s)) s"
  grep -v Warning "$WORK/${out##*/}.log" | tail -8 | cut -c1-400 | tee -a "$log"
}

both() {  # sdpa and varlen built at the same time
  copy sdpa && copy varlen && config varlen none
  doit_in sdpa pipeline.h200.yaml "aoti_package:$BUILD" & a=$!
  doit_in varlen pipeline.varlen.yaml "aoti_package:$BUILD" & b=$!
  wait $a; wait $b
}
serving() {  # serving NAME: the first answer of a copy's package
  OUT=$WORK/serving-$1 PHASES=${PHASES:-first mixed} MIXED=fixed PRELOAD=lib:tvm_ffi ROUNDS=${SERVING_ROUNDS:-3} \
    benchmarks/h200_serving.sh "$(pkg "$1")/aoti_package.json" "$WORK/$1/artifacts/$VERSION/model/inputs.pt" \
    2>&1 | tee -a "$log"
  tar -C "$WORK" -czf "$OUT/serving-$1.tgz" "serving-$1"
}

case "$PHASE" in
compare)
  both
  cp "$(pkg varlen)/tuning.json" "$OUT/varlen-tuning.json" 2>/dev/null
  late 70 latency || PROFILE=${PROFILE:-20} latency "$OUT/latency-compare.json" sdpa varlen
  late 50 serving || PHASES=first SERVING_ROUNDS=${SERVING_ROUNDS:-2} serving sdpa
  late 30 verify || doit_in varlen pipeline.varlen.yaml "verify:$BUILD"
  cp "$WORK/varlen/artifacts/$VERSION/verify/$BUILD/verify.json" "$OUT/varlen-verify.json" 2>/dev/null
  late 30 gemm || "$PY" benchmarks/gemm_probe.py --out "$OUT/gemm-l2.json" --skip tilelang,inductor,cublaslt,triton \
    > "$WORK/gemm.log" 2>&1
  ;;
build)
  both
  cp "$(pkg varlen)/tuning.json" "$OUT/varlen-tuning.json" 2>/dev/null
  late 60 verify || doit_in varlen pipeline.varlen.yaml "verify:$BUILD"
  cp "$WORK/varlen/artifacts/$VERSION/verify/$BUILD/verify.json" "$OUT/varlen-verify.json" 2>/dev/null
  late 90 latency || latency "$OUT/latency-build.json" sdpa varlen
  ;;
repro)
  for n in rep1 rep2; do
    copy "$n"
    cp -a "$WORK/varlen/artifacts" "$WORK/$n/" && rm -rf "$WORK/$n/artifacts/$VERSION/aoti_package"
    cp "$(pkg varlen)/tuning.json" "$WORK/$n/tuning/h200-$BUILD-varlen.json"
    config "$n" "tuning/h200-$BUILD-varlen.json"
  done
  doit_in rep1 pipeline.varlen.yaml "aoti_package:$BUILD" & a=$!
  doit_in rep2 pipeline.varlen.yaml "aoti_package:$BUILD" & b=$!
  wait $a; wait $b
  sha256sum "$(pkg varlen)/decision.pt2" "$(pkg rep1)/decision.pt2" "$(pkg rep2)/decision.pt2" | tee -a "$log"
  if ! cmp -s "$(pkg rep1)/decision.pt2" "$(pkg rep2)/decision.pt2"; then
    say "rep1 and rep2 DIFFER"
    "$PY" benchmarks/package_repro.py compare "$(pkg rep1)" "$(pkg rep2)" > "$OUT/compare-rep.json" 2>> "$log"
  fi
  late 60 verify || doit_in rep1 pipeline.varlen.yaml "verify:$BUILD"
  cp "$WORK/rep1/artifacts/$VERSION/verify/$BUILD/verify.json" "$OUT/rep1-verify.json" 2>/dev/null
  late 100 latency || latency "$OUT/latency-repro.json" sdpa varlen rep1
  late 120 serving || serving rep1
  ;;
esac
logs=$(cd "$WORK" && ls ./*.log 2>/dev/null)
[ -n "$logs" ] && tar -C "$WORK" -czf "$OUT/logs-$PHASE.tgz" $logs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__)" >> "$log" 2>&1
say "state: done in $SECONDS s"
