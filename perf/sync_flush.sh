#!/usr/bin/env bash
# Sync flush (issue 13, target 5), in one run: send-ack latency at 20,000 msg/s (1 KiB,
# 2 producers, one plain pull consumer, 8 queues, --flush sync) for revision REV (before)
# and this checkout (after), alternating, beside fio's fdatasync latency after 1 KiB
# O_DIRECT writes measured in the same run (before the first and after the last round).
# Each runs its own ringmq-bench. Usage: perf/sync_flush.sh REV [SECS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: perf/sync_flush.sh REV [SECS] [ROUNDS]}
SECS=${2:-10}
ROUNDS=${3:-3}
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
. perf/lib.sh
build_both "$REV"
setup_work ringmq-sync

fio_row() {
  fio --name=s --filename="$WORK/fio" --rw=write --bs=1k --size=16m --direct=1 --ioengine=sync \
      --fdatasync=1 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; p=json.load(sys.stdin)['jobs'][0]['sync']['lat_ns']['percentile']; print(f\"{'fio fdatasync':<22} {'':>9} {p['50.000000']/1000:>8.0f} {p['99.000000']/1000:>8.0f} {p['99.900000']/1000:>8.0f}\")"
  rm -f "$WORK/fio"
}

run() { # label broker-binary-dir
  rm -rf "$WORK/data"
  "$2"/ringmq-broker --listen 127.0.0.1:0 --data-dir "$WORK/data" --shards 2 --flush sync \
    >"$WORK/broker.out" 2>"$WORK/broker.err" &
  BROKER_PID=$!
  for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$WORK/broker.out")
  "$2"/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --rate 20000 --producers 2 \
    --consumers 1 --duration "$SECS" --json "$WORK/r.json" >/dev/null 2>&1 || true
  stop_broker
  python3 - "$WORK/r.json" "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); s = j["send_latency_us"]
print(f'{sys.argv[2]:<22} {j["produce"]["msgs_per_sec"]:>9.0f} {s["p50"]:>8} {s["p99"]:>8} {s["p999"]:>8}')
PY
}

echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, --flush sync) and bench on one host"
echo "send-ack latency (us) at 20,000 msg/s, 1 KiB, $SECS s per case; before = $REV"
printf '%-22s %9s %8s %8s %8s\n' case msg/s p50 p99 p99.9
fio_row
for round in $(seq "$ROUNDS"); do
  run "before r$round" "$BEFORE/release"
  run "after r$round" target/release
done
fio_row
