#!/usr/bin/env bash
# End-to-end figures with ringmq-bench against a real broker process on this host, in one
# run, printed as one table (and JSON files under perf/out/):
#   (a) produce throughput with a consumer draining concurrently (1 KiB and 4 KiB; batches
#       of 1, 32 and 1000), and producers alone in batches of 1000 (p-1k-b1000), (b) end-to-end latency at 1,000 and 20,000 msg/s open loop,
#   (c) sync flush: send-ack latency at 20,000 msg/s beside fio's fdatasync percentiles
#       (run first: see below),
#   (d) single sends (batch 1, 2 x 128 in flight) with a push consumer group keeping up,
#       plain and with the producer's coalescing, and a 1,000,000-message backlog drained
#       by push consumers pulling 32 at a time (cons/s of that row: the drain rate),
#   (e) the 20,000 msg/s rows again (async and sync) with the broker on one shard (-1sh;
#       since de94bb0 its CPU is by default the one taking the data disk's interrupts),
#   and first the machine's own scheduling jitter (perf/jitter.py), to read the tails against.
# The open-loop rows (lat-*, sync-*) measure after a 1 s warm-up (ringmq-bench --warmup 1,
# when the bench has it): the load generator's own start stays out of the tails.
# Broker: SHARDS shards (default 2), 8 queues. Usage: perf/e2e.sh [SECONDS_PER_CASE]
# RINGMQ_BIN=DIR runs the broker (and bench) in DIR instead of building this checkout
# (perf/compare.sh); RINGMQ_BENCH_BIN=DIR takes ringmq-bench from DIR instead;
# BENCH_ARGS="..." is added to every ringmq-bench command; TOKIO_WORKER_THREADS=N sets the
# bench's tokio threads (as --client-threads N, understood by every revision's bench).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
BIN=${RINGMQ_BIN:-target/release}
BENCH_BIN=${RINGMQ_BENCH_BIN:-$BIN}
SHARDS=${SHARDS:-2}
[ -n "${RINGMQ_BIN:-}" ] || cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
OUT=${RINGMQ_OUT:-perf/out}; mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ringmq-e2e.XXXX)
# The async cases write ~31 GiB into one data directory; past the broker's free-space floor
# its sends fail (DiskFull) and the cases after show as failed.
FREE_GIB=$(df -P --block-size=1G "$WORK" | awk 'NR == 2 { print $4 }')
[ "$FREE_GIB" -ge 40 ] || echo "warning: $FREE_GIB GiB free under $WORK; the cases write ~31 GiB: free space first or sends will fail"
BROKER_PID=
cleanup() { [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

start_broker() { # flush [shards]
  rm -rf "$WORK/data"
  "$BIN"/ringmq-broker --listen 127.0.0.1:17800 --data-dir "$WORK/data" --shards "${2:-$SHARDS}" --flush "$1" \
    >"$WORK/broker.out" 2>"$WORK/broker.err" &
  BROKER_PID=$!
  for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && return; sleep 0.1; done
  echo "broker did not start"; cat "$WORK/broker.err"; exit 1
}
stop_broker() { kill "$BROKER_PID"; wait "$BROKER_PID" || true; BROKER_PID=; }

bench() { # name args...
  local name=$1; shift
  rm -f "$OUT/$name.json"
  # shellcheck disable=SC2086
  "$BENCH_BIN"/ringmq-bench --broker 127.0.0.1:17800 --queues 8 --json "$OUT/$name.json" "$@" ${BENCH_ARGS:-} >"$WORK/$name.log" 2>&1 ||
    { echo "bench $name failed:"; tail -5 "$WORK/$name.log"; return; }
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p, c, s, e = j["produce"], j["consume"], j["send_latency_us"], j["e2e_latency_us"]
print(f'{sys.argv[2]:<28} {p["msgs_per_sec"]:>10.0f} {p["mb_per_sec"]:>8.1f} {c["msgs_per_sec"]:>10.0f} '
      f'{s["p50"]:>7.0f} {s["p99"]:>7.0f} {s["p999"]:>7.0f} {e["p50"]:>7.0f} {e["p99"]:>7.0f} {e["p999"]:>7.0f} {e["max"]:>8.0f}')
PY
}

# RINGMQ_NO_WARMUP=1 leaves it out (perf/compare.sh, when one side's bench lacks it).
WARMUP=()
[ -z "${RINGMQ_NO_WARMUP:-}" ] && "$BENCH_BIN"/ringmq-bench --help | grep -q -- --warmup && WARMUP=(--warmup 1)
echo "machine: $(nproc) cores, $(uname -r); broker and bench on the same host; $SHARDS shards, 8 queues; bench args: ${BENCH_ARGS:-none}"
python3 perf/jitter.py 3
printf '%-28s %10s %8s %10s %7s %7s %7s %7s %7s %7s %8s\n' case prod/s MB/s cons/s s.p50 s.p99 s.p999 e.p50 e.p99 e.p999 e.max
# Sync flush first, beside fio, while the device is quiet: the async rows write (and the
# broker restarts between cases remove) gigabytes, and on a discard-mounted file system the
# device is busy with those discards for a while after (a sync row run after them measured
# a send p99 of 33 ms where it measured 2 ms before them).
start_broker sync
bench sync-1k-20000ps --size 1024 --rate 20000 --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
stop_broker
start_broker sync 1
bench sync-1k-20000ps-1sh --size 1024 --rate 20000 --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
stop_broker
fio --name=s --filename="$WORK/fio" --rw=write --bs=1k --size=16m --direct=1 --ioengine=sync --fdatasync=1 \
    --output-format=json 2>/dev/null |
  python3 -c "import json,sys; p=json.load(sys.stdin)['jobs'][0]['sync']['lat_ns']['percentile']; print('fio fdatasync after 1 KiB O_DIRECT writes (us): p50', round(p['50.000000']/1000), 'p99', round(p['99.000000']/1000), 'p99.9', round(p['99.900000']/1000))"
start_broker async
bench t-1k-b1        --size 1024 --batch 1    --producers 2 --consumers 1 --duration "$SECS"
bench t-1k-b32       --size 1024 --batch 32   --producers 2 --consumers 1 --duration "$SECS"
bench t-1k-b1000     --size 1024 --batch 1000 --producers 2 --consumers 1 --duration "$SECS" --pull-batch 1000 --in-flight 4
# Producers alone (no consumer sharing the 2 cores): how producer-side batch figures, such
# as the issue's Iggy reference, are usually taken.
bench p-1k-b1000     --size 1024 --batch 1000 --producers 2 --consumers 0 --duration "$SECS" --in-flight 4
bench t-4k-b32       --size 4096 --batch 32   --producers 2 --consumers 1 --duration "$SECS"
bench lat-1k-1000ps  --size 1024 --rate 1000  --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
bench lat-1k-20000ps --size 1024 --rate 20000 --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
bench lat-4k-20000ps --size 4096 --rate 20000 --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
GROUP=(--group g --consumers 2 --consume-batch 32 --non-blocking-listener)
bench t-1k-b1-group    --size 1024 --batch 1  --producers 2 --in-flight 128 --duration "$SECS" "${GROUP[@]}"
bench t-1k-b1-coalesce --size 1024 --batch 1  --producers 2 --in-flight 128 --duration "$SECS" "${GROUP[@]}" --coalesce
bench drain-1k-b32     --size 1024 --batch 32 --producers 2 --messages 1000000 --consume-after-produce "${GROUP[@]}"
stop_broker
# One shard: on 2 cores shared with the load generator, a second shard mostly adds wake-ups.
start_broker async 1
bench lat-1k-20000ps-1sh --size 1024 --rate 20000 --producers 2 --consumers 1 --duration "$SECS" "${WARMUP[@]}"
stop_broker
echo "latencies in microseconds; s = send-ack, e = end-to-end; JSON in $OUT/"
