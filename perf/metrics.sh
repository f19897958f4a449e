#!/usr/bin/env bash
# What the metrics endpoint costs, in one run: the same produce load (1 KiB, 2 producers x
# 128 sends in flight, single sends and batches of 32, async flush, 2 shards, SECS s) against
# a broker without --metrics-listen and one with it, scraped every second; rounds alternate.
# Usage: perf/metrics.sh [SECS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
WORK=$(mktemp -d /tmp/ringmq-metrics.XXXX)
BROKER_PID=
SCRAPER=
cleanup() {
  [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null
  [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null
  wait 2>/dev/null; rm -rf "$WORK"
}
trap cleanup EXIT
. perf/lib.sh
PORT=$((30000 + RANDOM % 20000))
echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, async flush) and bench on one host"
printf '%-8s %-10s %12s %8s\n' round case msg/s scrapes
for round in 1 2 3; do
  for batch in 1 32; do
    for mode in off on; do
      scrapes=0
      if [ $mode = on ]; then
        PORT=$((PORT + 1))
        start_broker "$WORK" --metrics-listen "127.0.0.1:$PORT"
        ( while true; do curl -s "http://127.0.0.1:$PORT/metrics" >/dev/null && echo x >>"$WORK/scrapes"; sleep 1; done ) &
        SCRAPER=$!
      else
        start_broker "$WORK"
      fi
      rm -f "$WORK/scrapes"
      target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --batch $batch \
        --producers 2 --in-flight 128 --consumers 0 --duration "$SECS" --json "$WORK/r.json" >/dev/null 2>&1
      if [ -n "$SCRAPER" ]; then kill "$SCRAPER"; wait "$SCRAPER" 2>/dev/null || true; SCRAPER=; fi
      [ -f "$WORK/scrapes" ] && scrapes=$(wc -l <"$WORK/scrapes")
      stop_broker
      rate=$(python3 -c "import json;print(round(json.load(open('$WORK/r.json'))['produce']['msgs_per_sec']))")
      printf '%-8s %-10s %12s %8s\n' "$round" "b$batch-$mode" "$rate" "$scrapes"
    done
  done
done
