#!/usr/bin/env bash
# Single sends with and without the producer's coalescing (issue 13, target 1), in one run:
# ringmq-bench 1 KiB, --batch 1, 2 producers x 128 in flight, 8 queues, a push consumer
# group keeping up (2 members, 32 per listener call, listener on the runtime), async flush,
# 2 shards, SECS s per case; a fresh broker per case; rounds alternate.
# Usage: perf/single_sends.sh [SECS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
. perf/lib.sh
setup_work ringmq-single
echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, async flush) and bench on one host"
printf '%-6s %-10s %10s %10s %9s %9s %8s\n' round case prod/s cons/s e.p50us e.p99us missing
for round in 1 2 3; do
  for mode in plain coalesce; do
    extra=()
    [ $mode = coalesce ] && extra=(--coalesce)
    start_broker "$WORK"
    timeout 120 target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --batch 1 \
      --producers 2 --in-flight 128 --group g --consumers 2 --consume-batch 32 \
      --non-blocking-listener --duration "$SECS" "${extra[@]}" --json "$WORK/r.json" >/dev/null 2>&1 || true
    stop_broker
    python3 - "$WORK/r.json" "$round" "$mode" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
p, c, e = j["produce"], j["consume"], j["e2e_latency_us"]
print(f'{sys.argv[2]:<6} {sys.argv[3]:<10} {p["msgs_per_sec"]:>10.0f} {c["msgs_per_sec"]:>10.0f} {e["p50"]:>9} {e["p99"]:>9} {j["messages_missing"]:>8}')
PY
  done
done
