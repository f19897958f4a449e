#!/usr/bin/env bash
# Send latency while a shard does its file housekeeping, before and after, in one run:
# an open-loop load of 1 KiB single sends (20,000 msg/s, async flush, 2 shards, no
# consumer: the bench's consumer of 1,024 queues slows its own producers) over a topic of
# 1,024 queues, so every 5 s checkpoint finds ~1,000 dirty consume-queue files, while a
# second client commits 150,000 distinct offsets at 10,000/s (the offsets
# file passes its 4 MiB rewrite size several times). Before: the checkpoint msyncs every
# dirty file and the offsets file is written and rewritten on the shard thread. After:
# both run in the blocking pool.
# Each broker with its own ringmq-bench (the client's handshake changed in between).
# Usage: [REV=bfe25cf] perf/blocking.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-20}
BEFORE=/tmp/ringmq-abuse-before-target/release
. perf/lib.sh
build_before "${REV:-bfe25cf}" "${BEFORE%/release}" ringmq-broker ringmq-bench
cargo build --release --bin ringmq-broker --bin ringmq-bench --example abuse >/dev/null 2>&1
PORT=$((20000 + RANDOM % 20000))
run() {
  local label=$1 bin=$2
  local dir; dir=$(mktemp -d /tmp/ringmq-blocking.XXXX)
  PORT=$((PORT + 10))
  local addr=127.0.0.1:$PORT
  "$bin/ringmq-broker" --listen "$addr" --data-dir "$dir/data" --shards 2 >"$dir/out" 2>"$dir/err" &
  local pid=$!
  for _ in $(seq 100); do grep -q "ready" "$dir/out" 2>/dev/null && break; sleep 0.1; done
  grep -q "ready" "$dir/out" || { echo "broker did not start: $(cat "$dir/err")"; exit 1; }
  # Warm-up: the first send to each queue creates its index file (not measured here).
  "$bin/ringmq-bench" --broker "$addr" --topic many --queues 1024 --size 1024 \
    --rate 20000 --duration 3 --producers 2 --consumers 0 >/dev/null 2>&1
  "$bin/ringmq-bench" --broker "$addr" --topic many --queues 1024 --size 1024 \
    --rate 20000 --duration "$SECS" --producers 2 --consumers 0 --json "$dir/r.json" >/dev/null 2>&1 &
  local bench=$!
  sleep 2
  local commits; commits=$(target/release/examples/abuse commits "$addr" many 1024 150000 10000)
  wait $bench
  python3 - "$label" "$dir/r.json" "$commits" <<'PY'
import json, sys
label, path, commits = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.load(open(path))
def pick(k):
    for name in (k, k + "_us"):
        if name in r:
            return r[name]
    return {}
s, e = pick("send_latency"), pick("e2e_latency")
def f(d, p):
    v = d.get(p)
    return "-" if v is None else "%.1f" % (v / 1000)
print("| %-6s | %s | %s | %s | %s | %s |" % (label, f(s, "p50"), f(s, "p99"), f(s, "p999"), f(s, "max"), commits))
PY
  kill -TERM $pid; wait $pid 2>/dev/null || true
  rm -rf "$dir"
}
echo "| broker | send p50 ms | p99 ms | p99.9 ms | max ms | offset commits |"
echo "|---|---|---|---|---|---|"
for round in 1 2; do
  run before "$BEFORE"
  run after target/release
done
