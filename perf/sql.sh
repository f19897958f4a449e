#!/usr/bin/env bash
# What an SQL92 filter costs consumers, in one run: the same backlog (MESSAGES of 1 KiB,
# batches of 32, 8 queues, 2 shards, async flush) drained by 2 push consumers of a group
# (32 messages per listener call, listener on the runtime) with no filter, with a filter
# keeping 90% (`n100 < 90`) and one keeping 10% (`n100 < 10`); every message carries
# `n100`, its number modulo 100 (ringmq-bench --sql). Three rounds, interleaved.
# delivered/s: matching messages consumed per second; scanned/s: backlog messages passed
# per second (all of them, filtered or delivered).
# Usage: perf/sql.sh [MESSAGES]   (default 1,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
OUT=perf/out; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ringmq-sql.XXXX)
BROKER_PID=
cleanup() { [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

. perf/lib.sh

bench() {
  local name=$1; shift
  start_broker "$WORK"
  target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --batch 32 \
    --messages "$N" --group g --consumers 2 --consume-batch 32 --non-blocking-listener \
    --consume-after-produce --json "$OUT/sql-$name.json" "$@" >"$WORK/$name.log" 2>&1 ||
    { echo "bench $name failed:"; tail -5 "$WORK/$name.log"; }
  stop_broker
  python3 - "$OUT/sql-$name.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["consume"]
print(f'{sys.argv[2]:<14} {j["messages_sent"]:>9} {j["messages_expected"]:>9} {j["messages_received"]:>9} '
      f'{c["seconds"]:>7.2f} {c["msgs_per_sec"]:>11.0f} {j["messages_sent"] / c["seconds"]:>11.0f} {j["messages_missing"]:>7}')
PY
}

echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, async flush) and bench on one host"
echo "backlog: $N x 1 KiB in batches of 32 over 8 queues; 2 push consumers drain it after producing"
printf '%-14s %9s %9s %9s %7s %11s %11s %7s\n' case sent expected received cons.s delivered/s scanned/s missing
for round in 1 2 3; do
  bench "none-$round"
  bench "keep90-$round" --sql "n100 < 90"
  bench "keep10-$round" --sql "n100 < 10"
done
echo "JSON in $OUT/sql-*.json"
