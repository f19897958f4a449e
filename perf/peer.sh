#!/usr/bin/env bash
# ringmq against a peer, NATS JetStream (Debian's nats-server, file store), in one script
# run on this host, rounds alternating: the same workload driven by ringmq-bench and by
# perf/natsbench (ringmq-bench's workload and JSON report for JetStream: 8 subjects as the
# 8 queues, one pull consumer with AckPolicy::None). Each row on a fresh server and data dir.
#   b1:   single sends, 2 producers x 128 in flight, 1 KiB, one consumer keeping up (issue
#         13's target 1 is 3x NATS here); ringmq plain and coalesced (--coalesce), with the
#         broker's defaults (2 shards, 2 bench threads) and split (1 shard, 1 bench thread;
#         NATS runs with its defaults in every row: no like-for-like split row for it)
#   r20k: 20,000 msg/s open loop, 1 KiB, one consumer, 1 s warm-up; latency from the
#         scheduled send time (target 4); ringmq on 2 shards and on 1
# Prints every run and the medians with ringmq / NATS ratios (throughput) and NATS / ringmq
# (e2e p99). Usage: perf/peer.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-5}
command -v nats-server >/dev/null || { apt-get update -qq && apt-get install -y -qq nats-server >/dev/null; }
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null
cargo build --release --manifest-path perf/natsbench/Cargo.toml >/dev/null
NATSBENCH=perf/natsbench/target/release/natsbench
. perf/lib.sh
setup_work ringmq-peer
NATS_PID=
trap 'for p in "$BROKER_PID" "$NATS_PID"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"' EXIT
echo "machine: $(nproc) cores, $(uname -r); $(nats-server --version); ringmq $(git rev-parse --short HEAD)"
python3 perf/jitter.py 3
printf '%-26s %9s %9s %8s %8s %8s %8s %8s %8s\n' case prod/s cons/s s.p50 s.p99 s.p999 e.p50 e.p99 e.p999
: >"$WORK/rows"

row() { # name json
  python3 - "$2" "$1" "$WORK/rows" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); p, c, s, e = j["produce"], j["consume"], j["send_latency_us"], j["e2e_latency_us"]
r = [sys.argv[2], round(p["msgs_per_sec"]), round(c["msgs_per_sec"]), s["p50"], s["p99"], s["p999"], e["p50"], e["p99"], e["p999"]]
print(f'{r[0]:<26} ' + ' '.join(f'{v:>{9 if i < 2 else 8}}' for i, v in enumerate(r[1:])))
open(sys.argv[3], "a").write(json.dumps(r) + "\n")
PY
}

nats() { # name natsbench-args...
  local name=$1; shift
  rm -rf "$WORK/nats"
  nats-server -js -sd "$WORK/nats" -a 127.0.0.1 -p 14222 >"$WORK/nats.log" 2>&1 &
  NATS_PID=$!
  for _ in $(seq 100); do grep -q "Server is ready" "$WORK/nats.log" 2>/dev/null && break; sleep 0.1; done
  rm -f "$WORK/r.json"
  "$NATSBENCH" --server 127.0.0.1:14222 --size 1024 --producers 2 --queues 8 --duration "$SECS" \
    --json "$WORK/r.json" "$@" >"$WORK/bench.log" 2>&1 || { echo "$name failed"; tail -3 "$WORK/bench.log"; }
  kill "$NATS_PID" 2>/dev/null || true; wait "$NATS_PID" 2>/dev/null || true; NATS_PID=
  if [ -f "$WORK/r.json" ]; then row "$name" "$WORK/r.json"; fi
}

ringmq() { # name shards bench-args...
  local name=$1; SHARDS=$2; shift 2
  start_broker "$WORK"
  rm -f "$WORK/r.json"
  target/release/ringmq-bench --broker "$ADDR" --size 1024 --producers 2 --queues 8 --duration "$SECS" \
    --json "$WORK/r.json" "$@" >"$WORK/bench.log" 2>&1 || { echo "$name failed"; tail -3 "$WORK/bench.log"; }
  stop_broker 2>/dev/null || true
  if [ -f "$WORK/r.json" ]; then row "$name" "$WORK/r.json"; fi
}

B1=(--in-flight 128 --consumers 1)
R20=(--rate 20000 --consumers 1 --warmup 1)
for _ in $(seq "$ROUNDS"); do
  nats   nats-b1                       "${B1[@]}"
  ringmq ringmq-b1               2     "${B1[@]}" --batch 1
  ringmq ringmq-b1-coalesce      2     "${B1[@]}" --batch 1 --coalesce
  ringmq ringmq-b1-coalesce-split 1    "${B1[@]}" --batch 1 --coalesce --client-threads 1
  nats   nats-r20k                     "${R20[@]}"
  ringmq ringmq-r20k             2     "${R20[@]}"
  ringmq ringmq-r20k-1sh         1     "${R20[@]}"
done
python3 - "$WORK/rows" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r[0], []).append(r)
med = {k: [st.median(x[i] for x in v) for i in range(1, 9)] for k, v in by.items()}
print("\nmedians over rounds, and against NATS in the same run:")
print(f'{"case":<26} {"prod/s":>9} {"cons/s":>9} {"e.p99":>8} {"prod x NATS":>12} {"cons x NATS":>12} {"NATS e.p99 / this":>18}')
for k, m in med.items():
    ref = med.get("nats-b1" if "b1" in k else "nats-r20k")
    if ref is None:
        continue
    print(f'{k:<26} {m[0]:>9.0f} {m[1]:>9.0f} {m[6]:>8.0f} {m[0] / ref[0]:>12.2f} {m[1] / ref[1]:>12.2f} {ref[6] / max(m[6], 1):>18.1f}')
PY
