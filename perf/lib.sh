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

#   start_broker WORKDIR [ARGS...]       a fresh release broker (SHARDS, default 2) on a new data dir
#                                        in WORKDIR; sets BROKER_PID and ADDR
#   stop_broker                          SIGTERM and wait
start_broker() {
  local work=$1
  shift
  rm -rf "$work/data"
  target/release/ringmq-broker --listen 127.0.0.1:0 --data-dir "$work/data" --shards "${SHARDS:-2}" "$@" \
    >"$work/broker.out" 2>"$work/broker.err" &
  BROKER_PID=$!
  for _ in $(seq 100); do grep -q ready "$work/broker.out" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$work/broker.out")
  [ -n "$ADDR" ] || { echo "broker did not start"; cat "$work/broker.err"; exit 1; }
}
stop_broker() { kill "$BROKER_PID"; wait "$BROKER_PID" || true; BROKER_PID=; }

#   build_both REV                       BEFORE=the release binaries of REV (built once per
#                                        revision), and this checkout's built
build_both() {
  BEFORE=/tmp/ringmq-before-target-$(git rev-parse --short "$1")
  build_before "$1" "$BEFORE" ringmq-broker ringmq-bench
  cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
}

#   setup_work PREFIX                    WORK=a new temp dir; on exit the broker in BROKER_PID
#                                        (if any) is stopped and WORK removed
setup_work() {
  WORK=$(mktemp -d "/tmp/$1.XXXX")
  BROKER_PID=
  trap 'if [ -n "$BROKER_PID" ]; then kill "$BROKER_PID" 2>/dev/null; fi; wait 2>/dev/null; rm -rf "$WORK"' EXIT
}
