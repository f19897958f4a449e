#!/usr/bin/env bash
# The drain case of perf/e2e.sh alone (a 1,000,000-message backlog of 1 KiB, batches of 32,
# drained by 2 push consumers of one group pulling 32 at a time; 2 shards, async flush),
# before/after in one run: REV built in a temporary worktree against this checkout,
# alternating (before, after) for ROUNDS rounds. Prints produce and consume msg/s.
# Usage: perf/drain_ab.sh REV [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: perf/drain_ab.sh REV [ROUNDS]}
ROUNDS=${2:-3}
WT=$(mktemp -d /tmp/ringmq-before.XXXX)
W=$(mktemp -d /tmp/ringmq-drain.XXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null
  git worktree remove --force "$WT" >/dev/null 2>&1 || true
  rm -rf "$W" /tmp/ringmq-drain-before-target
}
trap cleanup EXIT
git worktree add --detach "$WT" "$REV" >/dev/null 2>&1
echo "building $REV (before) and the working tree (after)..."
(cd "$WT" && CARGO_TARGET_DIR=/tmp/ringmq-drain-before-target cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1)
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
run() { # bin label
  rm -rf "$W/data"
  "$1"/ringmq-broker --listen 127.0.0.1:17801 --data-dir "$W/data" --shards 2 --flush async >"$W/b.out" 2>"$W/b.err" &
  PID=$!
  for _ in $(seq 100); do grep -q ready "$W/b.out" 2>/dev/null && break; sleep 0.1; done
  "$1"/ringmq-bench --broker 127.0.0.1:17801 --queues 8 --json "$W/$2.json" --size 1024 --batch 32 --producers 2 \
    --messages 1000000 --consume-after-produce --group g --consumers 2 --consume-batch 32 --non-blocking-listener \
    >"$W/$2.log" 2>&1 || { echo "$2 failed:"; tail -3 "$W/$2.log"; }
  kill "$PID"; wait "$PID" || true; PID=
  python3 - "$W/$2.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f'{sys.argv[2]:<12} produce {j["produce"]["msgs_per_sec"]:>10.0f} msg/s   consume {j["consume"]["msgs_per_sec"]:>10.0f} msg/s')
PY
}
for r in $(seq "$ROUNDS"); do
  run /tmp/ringmq-drain-before-target/release "before-$r"
  run target/release "after-$r"
done
