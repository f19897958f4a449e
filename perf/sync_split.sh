#!/usr/bin/env bash
# Where a sync send's tail is: the bench's send-ack percentiles (from each send's scheduled
# time) beside the broker's own view from its metrics (ringmq_send_ack_seconds: append to
# acknowledgement; ringmq_fdatasync_seconds: each durable O_DSYNC write), as the share of
# sends / writes over 0.25, 0.5, 1 and 2.5 ms, and fio's fdatasync after 1 KiB O_DIRECT
# writes in the same round. One shard, 1 KiB, 20,000 msg/s, 2 producers, a consumer,
# --flush sync, this checkout's release build.
# Usage: perf/sync_split.sh [ROUNDS] [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-8}
. perf/lib.sh
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
setup_work ringmq-sync-split
METRICS=127.0.0.1:$((20000 + RANDOM % 20000))
echo "machine: $(nproc) cores, $(uname -r); 1 shard, flush sync, $(git rev-parse --short HEAD)"
echo "bench: --size 1024 --rate 20000 --producers 2 --consumers 1 --warmup 1 --queues 8 --duration $SECS"
for round in $(seq "$ROUNDS"); do
  fio --name=s --filename="$WORK/fio" --rw=write --bs=1k --size=16m --direct=1 --ioengine=sync --fdatasync=1 \
    --output-format=json 2>/dev/null |
    python3 -c "import json,sys; p=json.load(sys.stdin)['jobs'][0]['sync']['lat_ns']['percentile']; print('round $round: fio fdatasync p50 / p99 / p99.9 (us):', round(p['50.000000']/1000), '/', round(p['99.000000']/1000), '/', round(p['99.900000']/1000))"
  rm -f "$WORK/fio"
  SHARDS=1 start_broker "$WORK" --flush sync --metrics-listen "$METRICS"
  curl -s "http://$METRICS/metrics" >"$WORK/m0"
  target/release/ringmq-bench --broker "$ADDR" --queues 8 --duration "$SECS" --size 1024 --rate 20000 \
    --producers 2 --consumers 1 --warmup 1 --json "$WORK/r.json" >"$WORK/bench.log" 2>&1
  curl -s "http://$METRICS/metrics" >"$WORK/m1"
  stop_broker 2>/dev/null
  python3 - "$WORK" <<'PY'
import json, re, sys
w = sys.argv[1]
s = json.load(open(f"{w}/r.json"))["send_latency_us"]
print(f"  bench send p50 / p99 / p99.9 (us): {s['p50']} / {s['p99']} / {s['p999']}")
def buckets(path, name):
    d = {}
    for line in open(path):
        m = re.match(name + r'_bucket\{le="([^"]+)"[^}]*\} (\S+)', line)
        if m:
            d[m.group(1)] = float(m.group(2))
    return d
for name, label in (("ringmq_send_ack_seconds", "broker send-ack"), ("ringmq_fdatasync_seconds", "durable writes")):
    a, b = buckets(f"{w}/m0", name), buckets(f"{w}/m1", name)
    total = b["+Inf"] - a.get("+Inf", 0)
    over = lambda k: (total - (b[k] - a.get(k, 0))) / total * 100
    print(f"  {label:<16} {int(total):>7}: over 0.25 / 0.5 / 1 / 2.5 ms: "
          + " / ".join(f"{over(k):.2f}%" for k in ("0.00025", "0.0005", "0.001", "0.0025")))
PY
done
