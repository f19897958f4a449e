#!/usr/bin/env bash
# Transactional sends against plain sends, in one run: a fresh release broker (2 shards,
# FLUSH flush mode, temp data dir) per case; 2 producers x 128 sends in flight, 1 KiB
# bodies, SECS seconds per case; a transaction = half message + no-op local transaction +
# commit (its latency runs from the half's send to the commit's answer). Rounds alternate.
# Usage: perf/txn.sh [SECS] [FLUSH]   (default 5 async)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
FLUSH=${2:-async}
cargo build --release --bin ringmq-broker --example txn >/dev/null 2>&1
. perf/lib.sh
setup_work ringmq-txn
echo "machine: $(nproc) cores, $(uname -r); broker (2 shards, $FLUSH flush) and load on one host"
for round in 1 2 3; do
  for mode in plain txn; do
    start_broker "$WORK" --flush "$FLUSH"
    echo -n "round $round "
    target/release/examples/txn "$ADDR" "$mode" 2 128 "$SECS" 1024
    stop_broker
  done
done
