#!/usr/bin/env bash
# Shard count and spinning before parking, in one run (issue 13, tail latency): for each
# configuration "LABEL|SHARDS|BROKER ARGS", single sends (1 KiB, batch 1, 2 producers x 128
# in flight), the same coalesced, and 20,000 msg/s open loop, each with a push consumer
# group of 2 keeping up (32 per listener call, listener on the runtime); a fresh broker per
# case, two rounds. BENCH_EXTRA="..." is added to every bench command; CASES picks cases.
# Usage: perf/shards.sh SECS "2sh|2|" "2sh-spin50|2|--spin-before-park-us 50" "1sh|1|" ...
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:?usage: perf/shards.sh SECS "LABEL|SHARDS|BROKER ARGS"...}
shift
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
. perf/lib.sh
setup_work ringmq-shards
echo "machine: $(nproc) cores, $(uname -r); broker and bench on one host, async flush"
printf '%-22s %-6s %9s %9s %8s %8s %8s\n' config case prod/s cons/s e.p50 e.p99 e.p999
for round in 1 2; do
  for spec in "$@"; do
    label=${spec%%|*}; rest=${spec#*|}; export SHARDS=${rest%%|*}; args=${rest#*|}
    for case in ${CASES:-b1 b1c r20k}; do
      case $case in
        b1) extra=(--batch 1 --in-flight 128);;
        b1c) extra=(--batch 1 --in-flight 128 --coalesce);;
        r20k) extra=(--rate 20000);;
      esac
      # shellcheck disable=SC2086
      start_broker "$WORK" $args
      # shellcheck disable=SC2086
      timeout 120 target/release/ringmq-bench --broker "$ADDR" --queues 8 --size 1024 --producers 2 \
        --group g --consumers 2 --consume-batch 32 --non-blocking-listener --duration "$SECS" \
        "${extra[@]}" ${BENCH_EXTRA:-} --json "$WORK/r.json" >"$WORK/b.out" 2>&1 || tail -3 "$WORK/b.out"
      stop_broker
      python3 - "$WORK/r.json" "$label" "$case" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); p, c, e = j["produce"], j["consume"], j["e2e_latency_us"]
print(f'{sys.argv[2]:<22} {sys.argv[3]:<6} {p["msgs_per_sec"]:>9.0f} {c["msgs_per_sec"]:>9.0f} {e["p50"]:>8} {e["p99"]:>8} {e["p999"]:>8}')
PY
      rm -f "$WORK/r.json"
    done
  done
done
