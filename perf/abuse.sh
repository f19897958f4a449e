#!/usr/bin/env bash
# Peak broker memory (and stalls) under careless or hostile clients, before and after, in
# one run: builds REV (the broker before the bounds) in a worktree and this checkout, then
# for each broker runs every attack of perf/abuse.rs against a fresh release broker
# (2 shards, defaults, temp data dir) and reads its VmHWM (peak RSS) and VmRSS from /proc.
# Usage: [ATTACKS="lock-flood ..."] perf/abuse.sh [REV] [MANY_QUEUES_SECONDS]
#   REV defaults to bfe25cf (main before the hardening and bounded-resources work).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-bfe25cf}
MQ_SECS=${2:-75}
BEFORE_TARGET=/tmp/ringmq-abuse-before-target
. perf/lib.sh
build_before "$REV" "$BEFORE_TARGET" ringmq-broker
cargo build --release --bin ringmq-broker --example abuse >/dev/null 2>&1
ABUSE=target/release/examples/abuse
PORT=$((20000 + RANDOM % 20000))

kb() { awk -v k="$2" '$1==k":" {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# run_case LABEL BIN ATTACK...: a fresh broker, the setup and attack, then its memory.
run_case() {
  local label=$1 bin=$2 attack=$3
  local dir; dir=$(mktemp -d /tmp/ringmq-abuse.XXXX)
  PORT=$((PORT + 10))
  local addr=127.0.0.1:$PORT
  "$bin/ringmq-broker" --listen "$addr" --data-dir "$dir/data" --shards 2 >"$dir/out" 2>"$dir/err" &
  local pid=$!
  for _ in $(seq 100); do grep -q "ready" "$dir/out" 2>/dev/null && break; sleep 0.1; done
  grep -q "ready" "$dir/out" || { echo "broker did not start: $(cat "$dir/err")"; exit 1; }
  local start_kb; start_kb=$(kb $pid VmRSS)
  local note=""
  case $attack in
    unread-pulls)
      $ABUSE fill $addr big 16 1048576 >/dev/null
      note=$($ABUSE unread-pulls $addr big 2 256 5) ;;
    lock-flood)
      note=$($ABUSE lock-flood $addr 1) ;;
    key-lookups)
      $ABUSE fill $addr keyed 32 4000000 k1 >/dev/null
      note=$($ABUSE key-lookups $addr keyed k1 4) ;;
    many-queues)
      note=$($ABUSE many-queues $addr 25 1024 "$MQ_SECS") ;;
    parked-polls)
      # 200,000 long polls of one queue (one shard), past --long-polls-max (65,536).
      note=$($ABUSE parked-polls $addr idle 200 1000 8) ;;
  esac
  sleep 3
  local alive=yes
  kill -0 $pid 2>/dev/null || alive=no
  local peak after
  peak=$(kb $pid VmHWM); after=$(kb $pid VmRSS)
  kill -TERM $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  printf "| %-6s | %-12s | %6s | %8s | %8s | %-5s | %s |\n" "$label" "$attack" \
    "$((start_kb / 1024))" "$((peak / 1024))" "$((after / 1024))" "$alive" "$note"
  rm -rf "$dir"
}

echo "| broker | attack | RSS at start MiB | peak RSS MiB | RSS after MiB | alive | what the attack saw |"
echo "|---|---|---|---|---|---|---|"
for attack in ${ATTACKS:-unread-pulls lock-flood key-lookups many-queues parked-polls}; do
  run_case "before" "$BEFORE_TARGET/release" $attack
  run_case "after" target/release $attack
done
