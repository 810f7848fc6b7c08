#!/usr/bin/env bash
# Variants of the CUDA package of pipeline.h200.yaml built at the same time on one GPU machine,
# then timed side by side, one process a package, in turn (docs/measurements/runtime-h200.md).
#
#   VARIANTS='computed={"export":{"rotary":"computed"}} table={"package":{"tuning":{}}}' \
#     benchmarks/h200_variants.sh
#
# In the project root, TileLang importable.  Each variant NAME=JSON is a copy of the project under
# $WORK (default /tmp/laya-variants) whose pipeline.h200.yaml has JSON merged into it (mappings
# merged key by key, anything else replaced; {"package": {"tuning": {}}} builds without a tuning
# file, so Inductor tunes afresh and the build writes its own tuning.json).  Steps, each skipped
# once DEADLINE_S (default 560) is near:
#   1. `doit config=pipeline.variant.yaml aoti_package:cuda-bfloat16` in every copy, at once,
#      each stopped (its process group ended) once DEADLINE_S less BUILD_RESERVE_S (default 60) is
#      reached, so the steps after it and the log still come back;
#      each package's sha256, tuning.json and tuned kernels' sources (NAME-kernel-sources.tgz) to
#      $OUT (and, for a build refused because its tuning file lacked kernels, those kernels'
#      sources as NAME-untuned-kernels.tgz);
#   2. benchmarks/package_latency.py over every package, interleaved (ROUNDS, default 4; PROFILE
#      replays of each profiled when set; LAUNCH replays of each timed by host launch and CUDA events
#      when set; BLAS='NAME=LIBRARY ...' times NAME's package once more
#      as NAME-LIBRARY, its graphs captured with torch.backends.cuda.preferred_blas_library(LIBRARY);
#      FILL='full saved' times them once with every position of a row real, the default, and once
#      with each row its saved decision's own length, then padding: latency-full.json, latency-saved.json);
#   2b. with STATES (a comma-separated list of benchmarks/replay_states.py's conditions, e.g.
#      plain,other,one-at-a-time,plain-one-at-a-time), that probe over every package (STATES_REPEAT
#      repeats, default 1), to $OUT/states.json;
#   3. `doit verify:cuda-bfloat16` of the variants named in VERIFY (default: all but the first;
#      none: no verification);
#   4. the GPU tests named in TESTS (pytest node ids, FILE.py::FUNCTION; none: none; pytest is not
#      needed: each test function is called in a fresh interpreter).
# With ALGORITHMS=FILE (a path in the project, e.g. tuning/h200-cublaslt.json), first of all
# benchmarks/cublaslt_probe.py writes the fastest cuBLASLt algorithm of each encoder GEMM there
# (ALGOS candidates each, default 8; with SEARCH=ROUNDS, its search beyond them, SEARCH_S seconds
# a GEMM, default 25; with ALGO_ROUNDS=R, each algorithm timed R more times, round-robin; its rows
# to $OUT/cublaslt.json), so that the variant copies
# hold the file a variant's export.native_algorithms names (docs/concepts/native-ops.md).
# REUSE=1 keeps the package of a variant an earlier run on this machine built (same NAME) instead
# of building it again.  TREES='NAME=TARBALL ...' builds NAME from another revision of the project
# (`git archive --format=tar.gz -o TARBALL REV`) instead of this tree: the step before a change
# built beside the change.  Its log and JSON go to $OUT (default $WORK/out).
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
WORK=${WORK:-/tmp/laya-variants}
PY=${PYTHON:-python3}
VERSION=${VERSION:-0.1.0-h200}
BUILD=cuda-bfloat16
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-$WORK/out}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
mkdir -p "$WORK" "$OUT"
log=$OUT/variants.log
: > "$log"
. benchmarks/copies.sh
names=()
for v in ${VARIANTS:?set VARIANTS to NAME=JSON ...}; do names+=("${v%%=*}"); done
pkg() { echo "$WORK/$1/artifacts/$VERSION/aoti_package/$BUILD"; }
tree() {  # tree NAME: the tarball TREES names for NAME, or nothing
  local t
  for t in ${TREES:-}; do [ "${t%%=*}" = "$1" ] && { case ${t#*=} in /*) echo "${t#*=}" ;; *) echo "$SRC/${t#*=}" ;; esac; }; done
}
variant() {  # variant NAME JSON: a copy with pipeline.variant.yaml
  copy "$1" "$(tree "$1")"
  "$PY" - "$WORK/$1/pipeline.h200.yaml" "$WORK/$1/pipeline.variant.yaml" "$2" <<'PYEOF' || say "$1: bad JSON"
import json, sys, yaml
def merge(doc, patch):
    for key, value in patch.items():
        if isinstance(value, dict) and value and isinstance(doc.get(key), dict):
            merge(doc[key], value)
        else:
            doc[key] = value
doc = yaml.safe_load(open(sys.argv[1]))
merge(doc, json.loads(sys.argv[3]))
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
}

if [ -n "${ALGORITHMS:-}" ] && ! late 200 "cuBLASLt algorithms"; then
  s=$SECONDS
  mkdir -p "$(dirname "$ALGORITHMS")"
  search=()
  [ -n "${SEARCH:-}" ] && search=(--search "$SEARCH" --search-s "${SEARCH_S:-25}")
  [ -n "${ALGO_ROUNDS:-}" ] && search+=(--rounds "$ALGO_ROUNDS")
  "$PY" benchmarks/cublaslt_probe.py --out "$OUT/cublaslt.json" --algos "${ALGOS:-8}" "${search[@]}" \
    --write-algorithms "$ALGORITHMS" > "$WORK/cublaslt.log" 2>&1
  say "cuBLASLt algorithms to $ALGORITHMS: rc $? in $((SECONDS - s)) s"
  cp "$ALGORITHMS" "$OUT/" 2>/dev/null
fi

pids=()
for v in $VARIANTS; do
  name=${v%%=*}
  if [ -n "${REUSE:-}" ] && [ -f "$(pkg "$name")/decision.pt2" ]; then
    say "$name: its package from an earlier run of this machine, not rebuilt"
    continue
  fi
  variant "$name" "${v#*=}"
  limit=$(until_deadline "${BUILD_RESERVE_S:-60}")
  [ "$limit" -gt 0 ] || { say "deadline: build of $name skipped"; continue; }
  LIMIT_S=$limit doit_in "$name" pipeline.variant.yaml "aoti_package:$BUILD" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
built=()
for n in "${names[@]}"; do
  cp "$(pkg "$n")/tuning.json" "$OUT/$n-tuning.json" 2>/dev/null
  # the sources of the kernels the tuning entries configure, and, for a build refused for a
  # tuning file that lacked kernels, those kernels' sources: to compare the two
  for d in kernel-sources untuned-kernels; do
    [ -d "$(pkg "$n")/$d" ] && tar -C "$(pkg "$n")" -czf "$OUT/$n-$d.tgz" "$d"
  done
  [ -f "$(pkg "$n")/decision.pt2" ] || continue
  built+=("$n")
  sha256sum "$(pkg "$n")/decision.pt2" | sed "s|  .*|  $n|" | tee -a "$log"
done

if [ ${#built[@]} -gt 0 ] && ! late 70 latency; then
  first=${built[0]} args=() blas=()
  for n in "${built[@]}"; do args+=("$n=$(pkg "$n")/decision.pt2"); done
  for b in ${BLAS:-}; do  # NAME=LIBRARY: NAME's package again, its graphs captured with that GEMM library
    n=${b%%=*}
    [ -f "$(pkg "$n")/decision.pt2" ] && args+=("$n-${b#*=}=$(pkg "$n")/decision.pt2") blas+=(--blas "$n-${b#*=}=${b#*=}")
  done
  for fill in ${FILL:-full}; do  # FILL='full saved': the rounds once with each
    late 70 "latency ($fill rows)" && break
    s=$SECONDS name=latency${FILL:+-$fill}
    (cd "$WORK/$first" && PYTHONPATH="${PYTHONPATH:-}:$WORK/$first" "$PY" "$SRC/benchmarks/package_latency.py" \
      "artifacts/$VERSION/export/$BUILD" "artifacts/$VERSION/model/inputs.pt" "${args[@]}" --fill "$fill" \
      "${blas[@]}" --rounds "${ROUNDS:-4}" --preload lib:tvm_ffi ${PROFILE:+--profile "$PROFILE"} ${LAUNCH:+--launch "$LAUNCH"} --out "$OUT/$name.json") \
      > "$WORK/$name.log" 2>&1
    say "latency (${built[*]}, $fill rows) rc $? in $((SECONDS - s)) s"
    grep -v Warning "$WORK/$name.log" | tail -8 | cut -c1-400 | tee -a "$log"
  done
fi

if [ -n "${STATES:-}" ] && [ ${#built[@]} -gt 0 ] && ! late 90 "replay states"; then
  args=()
  for n in "${built[@]}"; do args+=("$n=$(pkg "$n")/decision.pt2"); done
  s=$SECONDS
  (cd "$WORK/${built[0]}" && PYTHONPATH="${PYTHONPATH:-}:$WORK/${built[0]}" "$PY" "$SRC/benchmarks/replay_states.py" \
    "artifacts/$VERSION/export/$BUILD" "artifacts/$VERSION/model/inputs.pt" "${args[@]}" \
    --conditions "$STATES" --repeat "${STATES_REPEAT:-1}" --out "$OUT/states.json") > "$WORK/states.log" 2>&1
  say "replay states (${built[*]}) rc $? in $((SECONDS - s)) s"
  tail -2 "$WORK/states.log" | cut -c1-600 | tee -a "$log"
fi

for n in ${VERIFY:-${built[@]:1}}; do
  [ "$n" = none ] && continue
  late 35 "verify of $n" && continue
  LIMIT_S=$(until_deadline 10) doit_in "$n" pipeline.variant.yaml "verify:$BUILD"
  cp "$WORK/$n/artifacts/$VERSION/verify/$BUILD/verify.json" "$OUT/$n-verify.json" 2>/dev/null
done

run_tests ${TESTS:-}

logs=$(cd "$WORK" && ls ./*.log 2>/dev/null)
[ -n "$logs" ] && tar -C "$WORK" -czf "$OUT/logs.tgz" $logs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log" 2>&1
"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> "$log" 2>&1
say "state: done in $SECONDS s"
