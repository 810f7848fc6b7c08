#!/usr/bin/env bash
# Byte reproducibility of the CUDA package (docs/measurements/aoti-h200.md, Reproducible bytes).
#
#   benchmarks/package_repro.sh NAME[=TUNING] NAME[=TUNING] ...
#
# In the project root of a GPU machine, TileLang on PYTHONPATH.  Builds the export of CONFIG
# (default pipeline.h200.yaml; doit export:<BUILD>), then compiles it once per NAME with
# benchmarks/package_repro.py into $REPRO/NAME (default REPRO=/tmp/repro), each compile with
# the package stage's emptied cache, seeded with the tuning file TUNING where given (a path, or
# the NAME of an earlier compile: its tuning.json), and compares every compile with the first.
# Stops starting compiles DEADLINE_S seconds after its start (default 540; NEED_S, default
# 140, is what one compile of the 28-layer package needs).
#   FREE=NAME    also compiles NAME, unseeded, in a cache folder of its own, beside the others
#                (its bytes are not compared: a fresh Inductor tuning, for the latency)
#   LATENCY=1    then times every package side by side (benchmarks/package_latency.py)
#   CACHES=1     also copies each compile's cache (its text files) to $OUT
# Copies the latency and a tarball of everything but the packages and caches (logs, tuning files,
# summaries, member and cubin comparisons) to $OUT.
set -u
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-pipeline.h200.yaml} BUILD=${BUILD:-cuda-bfloat16} VERSION=${VERSION:-0.1.0-h200}
REPRO=${REPRO:-/tmp/repro} DEADLINE_S=${DEADLINE_S:-540} NEED_S=${NEED_S:-140}
OUT=${OUT:-$REPRO/out}
mkdir -p "$REPRO" "$OUT"
log=$REPRO/repro.log
t0=$SECONDS
s=$SECONDS
$PY -m doit config="$CONFIG" "export:$BUILD" > "$REPRO/export.log" 2>&1
echo "export rc $? in $((SECONDS - s)) s" | tee -a "$log"
EXP=artifacts/$VERSION/export/$BUILD

free_pid=
if [ -n "${FREE:-}" ]; then
  $PY benchmarks/package_repro.py compile "$EXP" "$REPRO/$FREE" --cache-key "package-$BUILD-free" \
    > "$REPRO/$FREE.log" 2>&1 &
  free_pid=$!
fi
first=
for arg in "$@"; do
  name=${arg%%=*} tuning=
  [ "$arg" != "$name" ] && tuning=${arg#*=}
  [ -n "$tuning" ] && [ -f "$REPRO/$tuning/tuning.json" ] && tuning=$REPRO/$tuning/tuning.json
  if [ $((SECONDS - t0 + NEED_S)) -ge "$DEADLINE_S" ]; then echo "$name skipped: deadline" | tee -a "$log"; continue; fi
  s=$SECONDS
  $PY benchmarks/package_repro.py compile "$EXP" "$REPRO/$name" ${tuning:+--tuning "$tuning"} ${CONFIGS:+--configs "$CONFIGS"} \
    > "$REPRO/$name.log" 2>&1
  echo "compile $name (tuning ${tuning:-none}) rc $? in $((SECONDS - s)) s: $(tail -1 "$REPRO/$name.log" | cut -c1-300)" | tee -a "$log"
  if [ -z "$first" ]; then first=$name; continue; fi
  $PY benchmarks/package_repro.py compare "$REPRO/$first" "$REPRO/$name" > "$REPRO/compare_${first}_$name.json" 2>> "$log"
  $PY - "$REPRO/compare_${first}_$name.json" <<'PYEOF' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
for n, p in r["packages"].items():
    print(sys.argv[1].rsplit("/", 1)[-1], n, "identical" if p["identical"] else "DIFFER", p["sha256"],
          "members differing", len(p["differing"]), "of", p["members"], "only", len(p["only_a"]), len(p["only_b"]))
    for d in p["differing"][:40]:
        print("  ", d["a"], d["b"] if d["b"] != d["a"] else "", d["size"], "crc_equal" if d["crc_equal"] else "",
              d.get("bytes_differing", ""), d.get("first_offsets", ""))
k = r["kernels"]
print(" kernels", k["count"], "source differs", len(k["source_differs"]), "tuning entries differing",
      len(r["tuning"]["differing"]), k["heuristics"])
PYEOF
  $PY benchmarks/package_repro.py cubins "$REPRO/$first" "$REPRO/$name" > "$REPRO/cubins_${first}_$name.json" 2>> "$log" &&
    echo " cubins equal but the sources' times: $($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['all_equal_but_source_mtimes'])" "$REPRO/cubins_${first}_$name.json")" | tee -a "$log"
done
if [ -n "$free_pid" ]; then
  wait "$free_pid"; echo "compile $FREE (free) rc $?: $(tail -1 "$REPRO/$FREE.log" | cut -c1-300)" | tee -a "$log"
fi
if [ "${LATENCY:-0}" = 1 ] && [ $((SECONDS - t0 + 60)) -lt "$DEADLINE_S" ]; then
  pk=(); for d in "$REPRO"/*/decision.pt2; do pk+=("$(basename "$(dirname "$d")")=$d"); done
  $PY benchmarks/package_latency.py "$EXP" "artifacts/$VERSION/model/inputs.pt" "${pk[@]}" \
    --rounds "${ROUNDS:-4}" ${SHAPES:+--shapes "$SHAPES"} ${TIMING:+--timing "$TIMING"} --out "$OUT/latency.json" > "$REPRO/latency.log" 2>&1
  echo "latency rc $?" | tee -a "$log"; grep -v Warning "$REPRO/latency.log" | tail -4 | tee -a "$log"
fi
sha256sum "$REPRO"/*/*.pt2 | tee -a "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$log" 2>&1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> "$log" 2>&1
tar -C "$REPRO" -czf "$OUT/repro.tgz" --exclude='*.pt2' --exclude='cache.tgz' --exclude='out' . 2>/dev/null
if [ "${CACHES:-0}" = 1 ]; then  # each compile's cache (text files), at most 6 of them
  for d in $(ls "$REPRO"/*/cache.tgz 2>/dev/null | head -6); do cp "$d" "$OUT/cache_$(basename "$(dirname "$d")").tgz"; done
fi
cat "$log"
