#!/usr/bin/env bash
# Target 4 under real-time scheduling: the same ringmq-bench case (ARGS) alternating between
# plain scheduling and SCHED_FIFO priority 50 (`chrt -f 50`) for the broker and the bench
# (SIDES="plain broker bench fifo": FIFO for neither, the broker only, the bench only,
# both), each run with its own fresh broker (SHARDS, default 2); ROUNDS rounds (default 4).
# Prints produce msg/s and the send-ack and end-to-end p50/p99/p99.9 (us). Needs root.
# Usage: perf/sched_fifo.sh ARGS...   e.g. SHARDS=1 ROUNDS=8 perf/sched_fifo.sh --size 1024
#        --rate 20000 --producers 2 --consumers 1 --warmup 1 --duration 6
set -euo pipefail
cd "$(dirname "$0")/.."
. perf/lib.sh
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
setup_work ringmq-rt
ROUNDS=${ROUNDS:-4}
printf '%-6s %9s %8s %8s %8s %8s %8s %8s\n' side prod/s s.p50 s.p99 s.p999 e.p50 e.p99 e.p999
for _ in $(seq "$ROUNDS"); do
  for side in ${SIDES:-plain fifo}; do
    pre=(); preb=()
    case $side in fifo) pre=(chrt -f 50); preb=(chrt -f 50);; broker) pre=(chrt -f 50);; bench) preb=(chrt -f 50);; esac
    rm -rf "$WORK/data"
    "${pre[@]}" target/release/ringmq-broker --listen 127.0.0.1:0 --data-dir "$WORK/data" --shards "${SHARDS:-2}" ${BROKER_ARGS:-} >"$WORK/broker.out" 2>"$WORK/broker.err" &
    BROKER_PID=$!
    for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && break; sleep 0.1; done
    addr=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$WORK/broker.out")
    "${preb[@]}" target/release/ringmq-bench --broker "$addr" --queues 8 --json "$WORK/r.json" "$@" >"$WORK/bench.log" 2>&1 || { echo "$side failed"; tail -3 "$WORK/bench.log"; }
    stop_broker 2>/dev/null
    python3 - "$WORK/r.json" $side <<'PY'
import json,sys
j=json.load(open(sys.argv[1])); p=j["produce"]; s=j["send_latency_us"]; e=j["e2e_latency_us"]
print(f'{sys.argv[2]:<6} {p["msgs_per_sec"]:>9.0f} {s["p50"]:>8} {s["p99"]:>8} {s["p999"]:>8} {e["p50"]:>8} {e["p99"]:>8} {e["p999"]:>8}')
PY
    rm -f "$WORK/r.json"
  done
done
