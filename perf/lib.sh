# Shared by the before/after perf scripts: source it, then
#   build_before REV TARGET_DIR BIN...   builds BINs of revision REV (release) into
#                                        TARGET_DIR in a temporary worktree, once.
build_before() {
  local rev=$1 target=$2
  shift 2
  local missing=no bin
  for bin in "$@"; do [ -x "$target/release/$bin" ] || missing=yes; done
  [ $missing = no ] && return 0
  local wt; wt=$(mktemp -d /tmp/ringmq-before-wt.XXXX)
  git worktree add --detach "$wt" "$rev" >/dev/null 2>&1
  local args=()
  for bin in "$@"; do args+=(--bin "$bin"); done
  (cd "$wt" && CARGO_TARGET_DIR=$target cargo build --release "${args[@]}" >/dev/null 2>&1)
  git worktree remove --force "$wt" >/dev/null 2>&1 || true
}
