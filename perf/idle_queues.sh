#!/usr/bin/env bash
# What idle queues cost the broker, before and after consume-queue files are mapped lazily
# and closed when idle, in one run: builds REV in a worktree and this checkout (release),
# then for each broker (2 shards, defaults, temp data dir): 20 topics x 1,024 queues with a
# 2-byte send to each (perf/abuse.rs many-queues), IDLE seconds of heartbeats (slowest
# reported), then the consume-queue memory maps and descriptors the broker holds, its RSS,
# and a restart: seconds from start to "ready", and maps right after.
# Usage: perf/idle_queues.sh [REV] [IDLE_SECONDS]   (REV defaults to 48e60e7)
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-48e60e7}
IDLE=${2:-75}
BEFORE_TARGET=/tmp/ringmq-idle-before-target-$REV
. perf/lib.sh
build_before "$REV" "$BEFORE_TARGET" ringmq-broker
cargo build --release --bin ringmq-broker --example abuse >/dev/null 2>&1
ABUSE=target/release/examples/abuse
PORT=$((20000 + RANDOM % 20000))

held() { # PID -> "maps fds" on consume-queue files
  local maps fds
  maps=$(grep -ac /consumequeue/ "/proc/$1/maps" || true)
  fds=$(find "/proc/$1/fd" -lname '*/consumequeue/*' 2>/dev/null | wc -l)
  echo "$maps $fds"
}
stop() { # PID: SIGTERM and wait until it is gone (not our child: started in a subshell)
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1200); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}
rss_mib() { awk '$1=="VmRSS:" {print int($2/1024)}' "/proc/$1/status"; }

start() { # BIN DIR ADDR -> pid; waits for ready
  "$1/ringmq-broker" --listen "$3" --data-dir "$2/data" --shards 2 >"$2/out" 2>"$2/err" &
  local pid=$!
  for _ in $(seq 1200); do grep -q "ready" "$2/out" 2>/dev/null && break; sleep 0.1; done
  grep -q "ready" "$2/out" || { echo "broker did not start: $(cat "$2/err")" >&2; exit 1; }
  echo $pid
}

run_case() {
  local label=$1 bin=$2
  local dir; dir=$(mktemp -d /tmp/ringmq-idle.XXXX)
  PORT=$((PORT + 10))
  local addr=127.0.0.1:$PORT
  local pid; pid=$(start "$bin" "$dir" "$addr")
  local note; note=$($ABUSE many-queues "$addr" 20 1024 "$IDLE")
  local slowest=${note##*: }
  read -r maps fds < <(held $pid)
  local rss; rss=$(rss_mib $pid)
  stop $pid
  local t0; t0=$(date +%s.%N)
  pid=$(start "$bin" "$dir" "$addr")
  local took; took=$(echo "$(date +%s.%N) - $t0" | bc)
  read -r maps2 _ < <(held $pid)
  stop $pid
  printf "| %-6s | %s | %s | %s | %s | %.1f | %s |\n" "$label" "$slowest" "$maps" "$fds" "$rss" "$took" "$maps2"
  rm -rf "$dir"
}

echo "20,480 queues, one 2-byte message each; measured after ${IDLE} s idle"
echo "| broker | slowest heartbeat | cq maps | cq descriptors | RSS MiB | restart s | cq maps after restart |"
echo "|---|---|---|---|---|---|---|"
run_case before "$BEFORE_TARGET/release"
run_case after target/release
