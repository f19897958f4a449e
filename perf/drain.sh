#!/usr/bin/env bash
# Draining a backlog, before/after alternating in one run: revision REV (built once in a
# temporary worktree) against this checkout, ROUNDS times each, each side with its own
# broker (fresh data dir, SHARDS default 2, async flush) and its own bench. The bench first
# produces MESSAGES (default 4,000,000) 1 KiB messages in batches of 32, then a group of 2
# push consumers pulling 32 at a time (non-blocking listener) drains them. Prints the
# drain's msg/s, the duplicates the bench saw (a rebalance hands queues over while both
# consumers join: at-least-once), and the bench's CPU seconds over the whole run (user +
# system, all threads; the produce phase is the same on both sides when the change is
# on the consumer's side). AFTER_ARGS are extra broker flags for the after side only
# (`AFTER_ARGS="--tail-cache-mb 3072" perf/drain.sh HEAD 3`: the same build, the backlog
# in memory on the after side).
# Ends with fio's O_DIRECT sequential read bandwidth in the same directory (32 KiB reads,
# 16 in flight): a backlog past the tail cache is read from the disk, at most that fast.
# Usage: perf/drain.sh REV ROUNDS [MESSAGES]
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: perf/drain.sh REV ROUNDS [MESSAGES]}
ROUNDS=${2:?}
MESSAGES=${3:-4000000}
. perf/lib.sh
build_both "$REV"
setup_work ringmq-drain
echo "machine: $(nproc) cores, $(uname -r); ${SHARDS:-2} shards, flush async; before = $REV, after = working tree of $(git rev-parse --short HEAD) ${AFTER_ARGS:-}"
echo "bench: --size 1024 --batch 32 --producers 2 --messages $MESSAGES --consume-after-produce --group g --consumers 2 --consume-batch 32 --non-blocking-listener"
printf '%-7s %5s %10s %8s %10s %9s\n' side round drain/s missing duplicates bench.cpu
for round in $(seq "$ROUNDS"); do
  for side in before after; do
    bin=target/release
    [ $side = before ] && bin=$BEFORE/release
    rm -rf "$WORK/data"
    extra=()
    # shellcheck disable=SC2206 # flags split on spaces on purpose
    [ $side = after ] && extra=(${AFTER_ARGS:-})
    "$bin"/ringmq-broker --listen 127.0.0.1:0 --data-dir "$WORK/data" --shards "${SHARDS:-2}" \
      ${extra[@]+"${extra[@]}"} >"$WORK/broker.out" 2>"$WORK/broker.err" &
    BROKER_PID=$!
    for _ in $(seq 100); do grep -q ready "$WORK/broker.out" 2>/dev/null && break; sleep 0.1; done
    addr=$(sed -n 's/^ringmq-broker ready: listening on \([^ ]*\).*/\1/p' "$WORK/broker.out")
    [ -n "$addr" ] || { echo "$side: broker did not start"; cat "$WORK/broker.err"; exit 1; }
    /usr/bin/time -f '%U %S' -o "$WORK/time" "$bin"/ringmq-bench --broker "$addr" --size 1024 \
      --batch 32 --producers 2 --messages "$MESSAGES" --consume-after-produce --group g \
      --consumers 2 --consume-batch 32 --non-blocking-listener --json "$WORK/r.json" \
      >"$WORK/bench.out" 2>&1
    kill "$BROKER_PID"
    wait "$BROKER_PID" || true
    BROKER_PID=
    line=$(grep '^consume:' "$WORK/bench.out")
    rate=$(sed 's/.* s: \([0-9]*\) msg\/s.*/\1/' <<<"$line")
    missing=$(sed 's/.*(\([0-9]*\) missing.*/\1/' <<<"$line")
    dups=$(sed 's/.*, \([0-9]*\) duplicates.*/\1/' <<<"$line")
    cpu=$(awk '{printf "%.2f", $1 + $2}' "$WORK/time")
    printf '%-7s %5s %10s %8s %10s %9s\n' "$side" "$round" "$rate" "$missing" "$dups" "$cpu"
  done
done
if command -v fio >/dev/null; then
  if ! fio --name=seqread --filename="$WORK/fio" --size=2G --rw=read --bs=32k --iodepth=16 \
    --ioengine=io_uring --direct=1 2>"$WORK/fio.err" >"$WORK/fio.out"; then
    echo "fio failed:"
    cat "$WORK/fio.err"
  fi
  sed -n 's/^ *READ: bw=\([^ ]*\) (\([^)]*\)).*/fio O_DIRECT sequential read, 32 KiB x 16 in flight: \1 (\2)/p' "$WORK/fio.out"
  rm -f "$WORK/fio"
fi
