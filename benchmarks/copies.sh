# Sourced by the GPU benchmark scripts that build in copies of the project (h200_attention.sh, h200_variants.sh,
# h200_cache.sh, h200_ray.sh).  Needs SRC (the project root), WORK (where the copies go), log (and PY for doit_in).
#   say TEXT...   echo TEXT and append it to $log
#   doit_in NAME CONFIG TASK   a doit run in the copy NAME with config=CONFIG, logged to
#                 $WORK/NAME.TASK.log; says its exit status and time, and the log's tail on failure.
#                 With LIMIT_S set, the run is stopped after that many seconds (SIGTERM to its process
#                 group, SIGKILL 15 s later; exit status 124), so a script that must hand back its
#                 log by a deadline is not held past it by one build
#   until_deadline RESERVE   the seconds left before DEADLINE_S less RESERVE (0 when none)
#   late SECONDS WHAT   true (and says WHAT is skipped) when fewer than SECONDS are left before DEADLINE_S
#   copy NAME [TREE]  $WORK/NAME emptied, then the project's tree in it without its artifacts, GPU
#                 packs and virtual environment; or, given TREE, that gzipped tarball's tree (another
#                 revision of the project: `git archive --format=tar.gz -o TREE REV`)
say() { echo "$*" | tee -a "$log"; }
copy() {
  rm -rf "${WORK:?}/${1:?}" && mkdir -p "$WORK/$1"
  if [ -n "${2:-}" ]; then
    tar -C "$WORK/$1" -xzf "$2"
  else
    tar -C "$SRC" --exclude=./artifacts --exclude=./.gpu-pack --exclude=./.gpu-lite --exclude=./.venv -cf - . |
      tar -C "$WORK/$1" -xf -
  fi
}
doit_in() {  # doit_in NAME CONFIG TASK: a doit run in a copy, logged to $WORK/NAME.TASK.log
  local s=$EPOCHREALTIME name=$1 cfg=$2 task=$3 limit=()
  # timeout puts the run in a process group of its own and signals the whole group
  [ -n "${LIMIT_S:-}" ] && limit=(timeout -k 15 "$LIMIT_S")
  (cd "$WORK/$name" && PYTHONPATH="${PYTHONPATH:-}:$WORK/$name" "${limit[@]}" "$PY" -m doit config="$cfg" "$task") \
    > "$WORK/$name.${task%%:*}.log" 2>&1
  local rc=$?
  [ -n "${LIMIT_S:-}" ] && [ $rc -eq 124 -o $rc -eq 137 ] && say "$name: doit $task stopped at its limit of $LIMIT_S s"
  say "$name: doit $task rc $rc in $(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $s}") s"
  [ $rc -ne 0 ] && tail -5 "$WORK/$name.${task%%:*}.log" | cut -c1-400 | tee -a "$log"
  return $rc
}
until_deadline() {  # until_deadline RESERVE: seconds left before DEADLINE_S, less RESERVE; 0 when none
  local left=$((${DEADLINE_S:?} - SECONDS - ${1:-0}))
  echo $((left > 0 ? left : 0))
}
late() {  # late SECONDS WHAT: true, saying WHAT is skipped, when SECONDS would run past DEADLINE_S
  [ "$(until_deadline "${1:-0}")" -eq 0 ] && { say "deadline: $2 skipped"; return 0; }
  return 1
}
run_tests() {  # run_tests ID ...: each test function (FILE.py::FUNCTION) in a fresh interpreter, no pytest
  local t file func mod
  for t in "$@"; do
    [ "$t" = none ] && continue
    case $t in
      *.py::*) ;;
      *) say "tests: $t is not a test's node id (FILE.py::FUNCTION); not run"; continue ;;
    esac
    late 20 "$t" && continue
    file=${t%%::*} func=${t#*::}
    mod=$(echo "${file%.py}" | tr / .)
    "$PY" -c "import $mod as m; m.$func(); print('PASSED $t')" >> "$log" 2>&1 || say "FAILED $t"
  done
}
