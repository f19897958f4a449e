#!/usr/bin/env bash
# Push consumers (consumer groups) against batched producers, in one run, as one table:
#   (a) producers alone (batches of 32, closed loop): the produce rate to keep up with;
#   (b) push consumers draining what (a)-style producers wrote, started once producing is
#       over: their consume capacity, as a ratio to the produce rate of the same case;
#   (c) producers and push consumers at once, closed loop (they share the 2 cores);
#   (d) open loop at fixed offered rates, push consumers at once: do they keep up, and
#       the end-to-end latency;
#   (e) one message per listener call (RocketMQ's default): single sends; draining;
#       300,000 msg/s offered.
# Each case gets a fresh broker process (2 shards, async flush, new data dir). Push
# consumers: 2 members of a group, concurrent mode, 32 messages per listener call; "pool"
# = listener on tokio's blocking pool (the default), "rt" = --non-blocking-listener.
# Usage: perf/groups.sh [SECONDS_PER_CASE]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
OUT=perf/out; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ringmq-groups.XXXX)
BROKER_PID=
cleanup() { [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

. perf/lib.sh

# case name, then ringmq-bench arguments; one line of the table.
bench() {
  local name=$1; shift
  start_broker "$WORK"
  target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --duration "$SECS" \
    --json "$OUT/groups-$name.json" "$@" >"$WORK/$name.log" 2>&1 ||
    { echo "bench $name failed:"; tail -5 "$WORK/$name.log"; }
  stop_broker
  python3 - "$OUT/groups-$name.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p, c, e = j["produce"], j["consume"], j["e2e_latency_us"]
cons = c["msgs_per_sec"] if j["config"]["consumers"] else 0
print(f'{sys.argv[2]:<22} {p["msgs_per_sec"]:>10.0f} {p["seconds"]:>6.2f} {cons:>10.0f} {c["seconds"] if cons else 0:>6.2f} '
      f'{e["p50"] if cons else 0:>9.0f} {e["p99"] if cons else 0:>9.0f} {j["messages_missing"]:>7} {j["messages_duplicated"]:>5}')
PY
}

GROUP=(--group g --consumers 2 --consume-batch 32)
echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, async flush), producers and consumers on one host"
echo "1 KiB messages, 8 queues, 2 producers (128 sends in flight each), batches of 32 unless noted, ${SECS} s per case"
printf '%-22s %10s %6s %10s %6s %9s %9s %7s %5s\n' case prod/s prod.s cons/s cons.s e.p50us e.p99us missing dup
# (a) and (b) three times, interleaved: this VM's figures drift by 10-20% between minutes.
for round in 1 2 3; do
  bench "a-produce-only-$round" --batch 32 --consumers 0
  bench "b-drain-pool-$round"   --batch 32 "${GROUP[@]}" --consume-after-produce
  bench "b-drain-rt-$round"     --batch 32 "${GROUP[@]}" --consume-after-produce --non-blocking-listener
done
bench c-both-pool           --batch 32 "${GROUP[@]}"
bench c-both-rt             --batch 32 "${GROUP[@]}" --non-blocking-listener
bench c-both-rt-depth1      --batch 32 "${GROUP[@]}" --non-blocking-listener --pulls-in-flight 1
for rate in 300000 500000 600000; do
  bench "d-${rate}-pool"    --batch 32 --rate "$rate" "${GROUP[@]}"
  bench "d-${rate}-rt"      --batch 32 --rate "$rate" "${GROUP[@]}" --non-blocking-listener
done
bench e-single-cb1          --batch 1 --group g --consumers 2 --consume-batch 1
bench e-drain-cb1           --batch 32 --group g --consumers 2 --consume-batch 1 --consume-after-produce
bench e-300000-cb1          --batch 32 --rate 300000 --group g --consumers 2 --consume-batch 1
echo "prod.s: producing time; cons.s: from the start to the last message consumed (consumers that keep up end with the producers);"
echo "b rows: consumers start after producing, cons/s and cons.s count from their start; e2e latency there includes the backlog wait"
echo "JSON in $OUT/groups-*.json"
