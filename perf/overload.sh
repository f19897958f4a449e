#!/usr/bin/env bash
# Flow control under overload, in one run. The disk is made the bottleneck with the broker's
# testing write delay (DELAY_US per log write, default 2000: this VM's disk and fdatasync
# are faster than the CPU can feed them). (1) the rate a sync-flush broker (2 shards)
# sustains for 1 KiB single sends (closed loop, 2 producers x 128 in flight, 10 s); (2) an
# open-loop load at twice that rate for SECS s with one consumer group reading, while the
# broker's RSS is sampled every second: acknowledged msg/s, BrokerBusy answers (waited out
# by the producers), consumer end-to-end latency, RSS over time.
# Usage: perf/overload.sh [SECS]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
DELAY_US=${DELAY_US:-2000}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
. perf/lib.sh
setup_work ringmq-overload
echo "machine: $(nproc) cores, $(uname -r); data dir $(df -h "$WORK" | tail -1 | awk '{print $1}')"
start_broker "$WORK" --flush sync --testing-write-delay-us "$DELAY_US"
timeout 60 target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --batch 1 --producers 2 \
  --in-flight 128 --consumers 0 --duration 10 --json "$WORK/cap.json" >/dev/null 2>&1
stop_broker
CAP=$(python3 -c "import json;print(round(json.load(open('$WORK/cap.json'))['produce']['msgs_per_sec']))")
RATE=$((CAP * 2))
echo "sync flush, ${DELAY_US} us per log write: capacity (closed loop) $CAP msg/s; offered: $RATE msg/s for $SECS s"
start_broker "$WORK" --flush sync --testing-write-delay-us "$DELAY_US"
( for s in $(seq "$SECS"); do awk '$1=="VmRSS:" {printf "%d ", $2/1024}' "/proc/$BROKER_PID/status"; sleep 1; done; echo ) >"$WORK/rss" &
SAMPLER=$!
timeout $((SECS * 4 + 60)) target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --batch 1 --producers 2 \
  --in-flight 256 --rate "$RATE" --group g --consumers 1 --duration "$SECS" \
  --request-timeout-ms 10000 --json "$WORK/over.json" >"$WORK/over.log" 2>&1 || true
wait "$SAMPLER"
stop_broker
[ -f "$WORK/over.json" ] || { echo "the load did not finish:"; tail -5 "$WORK/over.log"; exit 1; }
python3 - "$WORK/over.json" "$SECS" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); secs = float(sys.argv[2])
p, c, e = j["produce"], j["consume"], j["e2e_latency_us"]
print(f'acknowledged: {j["messages_sent"]} ({p["msgs_per_sec"]:.0f} msg/s); failed sends: {j["send_errors"]}; '
      f'busy answers waited out: {j["busy_answers"]} ({j["busy_answers"] / secs:.0f}/s)')
print(f'consumed: {j["messages_received"]} ({c["msgs_per_sec"]:.0f} msg/s), missing {j["messages_missing"]}; '
      f'e2e p50 {e["p50"]} us, p99 {e["p99"]} us, max {e["max"]} us')
PY
echo "broker RSS MiB, each second: $(cat "$WORK/rss")"
