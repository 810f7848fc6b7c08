# Sourced by the GPU benchmark scripts that build in copies of the project (h200_attention.sh,
# h200_cache.sh, h200_ray.sh).  Needs SRC (the project root), WORK (where the copies go) and log.
#   say TEXT...   echo TEXT and append it to $log
#   copy NAME     $WORK/NAME emptied, then the project's tree in it without its artifacts, GPU packs
#                 and virtual environment
say() { echo "$*" | tee -a "$log"; }
copy() {
  rm -rf "${WORK:?}/${1:?}" && mkdir -p "$WORK/$1"
  tar -C "$SRC" --exclude=./artifacts --exclude=./.gpu-pack --exclude=./.venv -cf - . | tar -C "$WORK/$1" -xf -
}
