#!/usr/bin/env bash
# Ordered-consumption failover: how long the queues of a killed orderly consumer stay
# unconsumed. One run: a fresh 8-queue topic and group on a broker process (2 shards,
# default settings), steady keyed load from ringmq-bench (1 producer, 2000 msg/s, 64
# sharding keys, no bench consumers), 3 `ringmq consume --group --orderly` processes
# (--process-ms 1); after 3 s of load one consumer is SIGKILLed. For each queue it held,
# the resume time is from the kill (bash's $EPOCHREALTIME right before `kill -9`) to the
# first START line of that queue printed by another consumer. A run's figure is the max
# over the killed consumer's queues. Prints every run, then p50 and max over the runs.
# It includes the wait for the queue's next message (about 4 ms apart per queue here).
# Usage: perf/failover.sh [RUNS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-10}
RATE=2000
cargo build --release --bin ringmq-broker --bin ringmq-bench --bin ringmq >/dev/null 2>&1
BIN=target/release
WORK=$(mktemp -d /tmp/ringmq-failover.XXXX)
BROKER_PID=
CONSUMER_PIDS=()
cleanup() {
  for p in "${CONSUMER_PIDS[@]}" $BROKER_PID; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The broker listens on an ephemeral port (a fixed one may be shared with another broker
# through SO_REUSEPORT); its ready line gives the address.
$BIN/ringmq-broker --listen 127.0.0.1:0 --data-dir "$WORK/data" --shards 2 \
  >"$WORK/broker.out" 2>"$WORK/broker.err" &
BROKER_PID=$!
for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && break; sleep 0.1; done
ADDR=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$WORK/broker.out")
[ -n "$ADDR" ] || { echo "broker did not start"; cat "$WORK/broker.err"; exit 1; }
RINGMQ=("$BIN/ringmq" --broker "$ADDR")

echo "machine: $(nproc) cores, $(uname -r); broker (2 shards), bench and 3 consumers on one host"
echo "load: ringmq-bench --producers 1 --consumers 0 --rate $RATE --keys 64 --queues 8; consumers: ringmq consume --group --orderly --process-ms 1"
printf '%-4s %-7s %-12s %s\n' run killed queues "resume ms per queue (max)"
: >"$WORK/results"
for run in $(seq "$RUNS"); do
  topic=failover-$run group=g-failover-$run dir=$WORK/run-$run
  mkdir -p "$dir"
  "${RINGMQ[@]}" topic create "$topic" --queues 8 >/dev/null
  CONSUMER_PIDS=()
  for c in 0 1 2; do
    "${RINGMQ[@]}" consume "$topic" --group "$group" --orderly --from last --process-ms 1 \
      --print-start --client-id "c$c" >"$dir/c$c.out" 2>"$dir/c$c.err" &
    CONSUMER_PIDS+=($!)
  done
  # Wait for 3 members sharing the 8 queues.
  for _ in $(seq 200); do
    n=$("${RINGMQ[@]}" --json group members "$group" | python3 -c '
import json, sys
m = json.load(sys.stdin)["members"]
q = {x for mm in m for t in mm["topics"] for x in t["queues"]}
print(len(m) if len(q) == 8 else 0)')
    [ "$n" = 3 ] && break
    sleep 0.05
  done
  [ "$n" = 3 ] || { echo "run $run: the group did not settle"; exit 1; }
  $BIN/ringmq-bench --broker "$ADDR" --topic "$topic" --queues 8 --producers 1 --consumers 0 \
    --rate "$RATE" --keys 64 --duration 7 >"$dir/bench.out" 2>&1 &
  bench=$!
  sleep 3
  victim=$(( (run - 1) % 3 ))
  queues=$("${RINGMQ[@]}" --json group members "$group" | python3 -c '
import json, sys
for m in json.load(sys.stdin)["members"]:
    if m["client_id"] == sys.argv[1]:
        print(",".join(str(q) for t in m["topics"] for q in t["queues"]))' "c$victim")
  t=$EPOCHREALTIME
  kill -9 "${CONSUMER_PIDS[$victim]}"
  kill_ns=${t/./}000
  wait "${CONSUMER_PIDS[$victim]}" 2>/dev/null || true
  wait "$bench" || { echo "run $run: bench failed"; cat "$dir/bench.out"; exit 1; }
  sleep 0.5
  for c in 0 1 2; do
    [ "$c" = "$victim" ] && continue
    kill -TERM "${CONSUMER_PIDS[$c]}"
    wait "${CONSUMER_PIDS[$c]}" || echo "run $run: c$c exited with $?"
  done
  CONSUMER_PIDS=()
  python3 - "$dir" "c$victim" "$queues" "$kill_ns" "$run" >>"$WORK/results" <<'PY'
import glob, sys
d, victim, queues, kill_ns, run = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
queues = [int(q) for q in queues.split(",") if q]
first = {}
for path in glob.glob(f"{d}/c*.out"):
    for line in open(path):
        f = dict(w.split("=", 1) for w in line.split(" body=")[0].split()[1:])
        q, t = int(f["queue"]), int(f["start_ns"])
        if f["client"] != victim and q in queues and t >= kill_ns:
            first[q] = min(first.get(q, t), t)
missing = [q for q in queues if q not in first]
res = {q: (first[q] - kill_ns) / 1e6 for q in first}
mx = max(res.values()) if res and not missing else float("inf")
detail = " ".join(f"q{q}={res[q]:.1f}" for q in sorted(res)) + (f" never: {missing}" if missing else "")
print(f"{run} {victim} {','.join(map(str, queues))} {mx:.1f} {detail}")
PY
  tail -1 "$WORK/results" | awk '{printf "%-4s %-7s %-12s ", $1, $2, $3; for (i = 5; i <= NF; i++) printf "%s ", $i; printf "(%s)\n", $4}'
done
python3 - "$WORK/results" <<'PY'
import statistics, sys
runs = [float(l.split()[3]) for l in open(sys.argv[1])]
s = sorted(runs)
p50 = statistics.median(s)
print(f"runs {len(s)}: resume time of the killed consumer's queues (max per run): "
      f"p50 {p50:.1f} ms, max {s[-1]:.1f} ms, min {s[0]:.1f} ms")
PY
