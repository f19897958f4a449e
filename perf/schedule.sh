#!/usr/bin/env bash
# Scheduled (delayed) messages, end to end with ringmq-bench against a broker process:
#   (a) produce cost: single sends, closed loop, plain vs scheduled (--delay-ms 600000, so
#       nothing is delivered during the case), same broker settings, one after the other;
#   (b) steady traffic alone: 20,000 msg/s open loop, e2e latency;
#   (c) the same steady traffic while 100,000 scheduled messages fall due within about one
#       second (sent as fast as 2 producers x 256 in flight allow, each due 10 s after its
#       send): the burst's delivery lateness and the steady traffic's e2e latency.
# 1 KiB bodies, async flush, 2 shards, 8 queues. Usage: perf/schedule.sh [SECONDS_PER_CASE]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
OUT=perf/out/schedule; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ringmq-schedule.XXXX)
BROKER_PID=
cleanup() { [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

start_broker() {
  rm -rf "$WORK/data"
  target/release/ringmq-broker --listen 127.0.0.1:17900 --data-dir "$WORK/data" --shards 2 \
    >"$WORK/broker.out" 2>"$WORK/broker.err" &
  BROKER_PID=$!
  for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && return; sleep 0.1; done
  echo "broker did not start"; cat "$WORK/broker.err"; exit 1
}
stop_broker() { kill "$BROKER_PID"; wait "$BROKER_PID" || true; BROKER_PID=; }
rss_mb() { awk '/VmHWM/ {print int($2/1024)}' "/proc/$BROKER_PID/status"; }

bench() { # name args...
  local name=$1; shift
  target/release/ringmq-bench --broker 127.0.0.1:17900 --queues 8 --size 1024 --json "$OUT/$name.json" "$@" \
    >"$WORK/$name.log" 2>&1 || { echo "bench $name failed:"; tail -5 "$WORK/$name.log"; }
}
row() { # name
  python3 - "$OUT/$1.json" "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p, e, l = j["produce"], j["e2e_latency_us"], j.get("delivery_lateness_us")
late = f'{l["p50"]:>8.0f} {l["p99"]:>8.0f} {l["max"]:>8.0f}' if l and l["samples"] else f'{"-":>8} {"-":>8} {"-":>8}'
print(f'{sys.argv[2]:<22} {p["msgs_per_sec"]:>10.0f} {j["messages_received"]:>9} {j["messages_missing"]:>7} '
      f'{e["p50"]:>8.0f} {e["p99"]:>8.0f} {e["p999"]:>8.0f} {late}')
PY
}

echo "machine: $(nproc) cores, $(uname -r); broker and bench on the same host; 2 shards, 8 queues, 1 KiB, async flush"
printf '%-22s %10s %9s %7s %8s %8s %8s %8s %8s %8s\n' case prod/s recv missing e.p50 e.p99 e.p999 late.p50 late.p99 late.max
start_broker
bench plain-b1  --batch 1 --producers 2 --in-flight 128 --consumers 0 --duration "$SECS" --topic plain
bench sched-b1  --batch 1 --producers 2 --in-flight 128 --consumers 0 --duration "$SECS" --topic sched --delay-ms 600000
row plain-b1; row sched-b1
echo "broker peak RSS after (a): $(rss_mb) MB"
stop_broker

start_broker
bench steady-alone --rate 20000 --producers 2 --consumers 1 --duration $((SECS * 3)) --topic steady
row steady-alone
stop_broker

start_broker
bench steady-burst --rate 20000 --producers 2 --consumers 1 --duration $((SECS * 3 + 12)) --topic steady &
STEADY=$!
sleep "$SECS"
bench burst --messages 100000 --delay-ms 10000 --batch 1 --producers 2 --in-flight 256 --consumers 1 --topic burst
wait "$STEADY"
row steady-burst; row burst
echo "burst send window: $(python3 -c "import json; print(round(json.load(open('$OUT/burst.json'))['produce']['seconds'], 2))") s (its messages fall due over as long)"
echo "broker peak RSS after (c): $(rss_mb) MB"
stop_broker
echo "e = end-to-end latency (us, from the send time); late = delivery lateness (us, consumed time minus due time)"
