#!/usr/bin/env bash
# One ringmq-bench case, before/after, alternating in one run: revision REV (built once in
# a temporary worktree) against this checkout, ROUNDS times each, each side with its own
# broker (fresh data dir) and its own bench. Prints produce/consume msg/s and the send-ack
# and end-to-end p50/p99/p99.9 (us) of every run, and the CPU time the broker and the bench
# each spent per message produced (b.us/m, c.us/m: user + system, all threads; less noisy
# than the rates on a shared VM). FLUSH=sync runs the brokers with --flush sync; SHARDS sets
# their shards (default 2). BENCH=after runs this tree's ringmq-bench on both sides (a
# broker change measured with bench options REV's bench lacks, such as --warmup).
# Usage: perf/ab.sh REV ROUNDS SECS -- BENCH_ARGS...
#   e.g. perf/ab.sh 933fb63 4 5 -- --size 1024 --batch 1000 --producers 2 --consumers 1 \
#        --pull-batch 1000 --in-flight 4
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: perf/ab.sh REV ROUNDS SECS -- BENCH_ARGS...}
ROUNDS=${2:?}
SECS=${3:?}
shift 3
[ "${1:-}" = "--" ] && shift
. perf/lib.sh
build_both "$REV"
setup_work ringmq-ab
echo "machine: $(nproc) cores, $(uname -r); ${SHARDS:-2} shards, flush ${FLUSH:-async}; before = $REV, after = working tree of $(git rev-parse --short HEAD)"
echo "bench: --queues 8 --duration $SECS $*"
printf '%-7s %9s %9s %8s %8s %8s %8s %8s %8s %7s %7s\n' side prod/s cons/s s.p50 s.p99 s.p999 e.p50 e.p99 e.p999 b.us/m c.us/m
TIMEFORMAT='%U %S'
for _ in $(seq "$ROUNDS"); do
  for side in before after; do
    bin=target/release
    [ $side = before ] && bin=$BEFORE/release
    rm -rf "$WORK/data"
    "$bin"/ringmq-broker --listen 127.0.0.1:0 --data-dir "$WORK/data" --shards "${SHARDS:-2}" \
      --flush "${FLUSH:-async}" >"$WORK/broker.out" 2>"$WORK/broker.err" &
    BROKER_PID=$!
    for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && break; sleep 0.1; done
    addr=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$WORK/broker.out")
    # The bench's CPU (user, system seconds) from bash's `time`, on fd 3's file.
    bench_bin=$bin
    [ "${BENCH:-}" = after ] && bench_bin=target/release
    { time "$bench_bin"/ringmq-bench --broker "$addr" --queues 8 --duration "$SECS" --json "$WORK/r.json" "$@" \
      >"$WORK/bench.log" 2>&1 || { echo "$side: bench failed"; tail -3 "$WORK/bench.log"; }; } 2>"$WORK/bench.cpu"
    # The broker's CPU: utime + stime of all its threads, in clock ticks, before it stops.
    broker_ticks=$(awk '{print $14 + $15}' "/proc/$BROKER_PID/stat")
    stop_broker 2>/dev/null
    [ -f "$WORK/r.json" ] && python3 - "$WORK/r.json" "$side" "$broker_ticks" "$(getconf CLK_TCK)" \
      "$(tail -1 "$WORK/bench.cpu")" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); p, c, s, e = j["produce"], j["consume"], j["send_latency_us"], j["e2e_latency_us"]
n = max(j["messages_sent"], 1)
broker_us = int(sys.argv[3]) / int(sys.argv[4]) * 1e6 / n
bench_us = sum(float(x) for x in sys.argv[5].split()) * 1e6 / n
print(f'{sys.argv[2]:<7} {p["msgs_per_sec"]:>9.0f} {c["msgs_per_sec"]:>9.0f} {s["p50"]:>8} {s["p99"]:>8} {s["p999"]:>8} {e["p50"]:>8} {e["p99"]:>8} {e["p999"]:>8} {broker_us:>7.2f} {bench_us:>7.2f}')
PY
    rm -f "$WORK/r.json"
  done
done
rm -rf "$WORK/data"
