#!/usr/bin/env bash
# Which writes io_uring hands to its workers (io-wq) instead of issuing them inline, at
# 20,000 msg/s, one shard, 1 KiB, --flush sync (or FLUSH=async): traces the kernel's
# io_uring_queue_async_work and iomap_dio_rw_begin/complete events for 2 s (root and
# tracefs needed) and counts the log's zeroing writes (256 KiB, past the file's size), the
# data writes, and other requests (glommio's eventfd writes), by the thread that issued
# each. Prints the data writes' latency in the kernel (issue to completion) and how many
# of the slow ones overlapped a zeroing write.
# Usage: perf/punts.sh [SECS_BEFORE_TRACE]
set -euo pipefail
cd "$(dirname "$0")/.."
T=/sys/kernel/tracing
[ -w $T/trace ] || { echo "needs a writable $T"; exit 1; }
. perf/lib.sh
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
setup_work ringmq-punts
SHARDS=1 start_broker "$WORK" --flush "${FLUSH:-sync}"
target/release/ringmq-bench --broker "$ADDR" --queues 8 --duration 8 --size 1024 --rate 20000 \
  --producers 2 --consumers 1 --warmup 1 --json "$WORK/r.json" >"$WORK/bench.log" 2>&1 &
BENCH=$!
echo 0 >$T/tracing_on; echo >$T/trace; echo 20000 >$T/buffer_size_kb
sleep "${1:-3}"
for e in io_uring/io_uring_queue_async_work iomap/iomap_dio_rw_begin iomap/iomap_dio_complete; do
  echo 1 >$T/events/$e/enable
done
echo 1 >$T/tracing_on; sleep 2; echo 0 >$T/tracing_on
echo 0 >$T/events/enable
cp $T/trace "$WORK/trace"; echo >$T/trace
wait $BENCH
stop_broker 2>/dev/null
python3 - "$WORK/trace" <<'PY'
import collections, re, sys
line_re = re.compile(r'^\s*(\S+)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (\w+): (.*)$')
num = lambda key, rest: int(re.search(key + r' (0x[0-9a-f]+)', rest).group(1), 16)
counts = collections.Counter()
begun, zeroing, spans, data, by_worker = {}, {}, [], [], []
for line in open(sys.argv[1]):
    m = line_re.match(line)
    if not m:
        continue
    comm, _, _, t, event, rest = m.groups()
    t, worker = float(t), comm.startswith("iou-wrk")
    if event == "io_uring_queue_async_work":
        op = re.search(r'opcode (\w+)', rest).group(1)
        counts[f"handed to io-wq: {op} (user_data {'0: eventfd' if 'user_data 0x0,' in rest else 'set'})"] += 1
    elif event == "iomap_dio_rw_begin":
        off, size, length = num("offset", rest), num("size", rest), num("length", rest)
        if off >= size:
            counts[f"zeroing writes past the file's size, issued by {'io-wq' if worker else 'the shard'}"] += 1
            zeroing.setdefault(off + length, t)
        else:
            counts[f"data writes issued by {'io-wq' if worker else 'the shard'}"] += 1
            if worker:
                by_worker.append(t)
            begun.setdefault(off + length, t)
    elif event == "iomap_dio_complete":
        end = num("offset", rest)
        if end in zeroing:
            spans.append((zeroing.pop(end), t))
        elif end in begun:
            t0 = begun.pop(end)
            data.append((t - t0, t0))
for k, v in sorted(counts.items()):
    print(f"{v:>7}  {k}")
data.sort()
if data:
    q = lambda p: round(data[min(len(data) - 1, int(p * len(data)))][0] * 1e6)
    print(f"data writes in the kernel (us): p50 {q(0.5)}, p99 {q(0.99)}, p99.9 {q(0.999)}, of {len(data)}")
    slow = [d for d in data if d[0] > 0.0005]
    hit = sum(any(a < t0 + d and b > t0 for a, b in spans) for d, t0 in slow)
    print(f"data writes over 500 us: {len(slow)}, of which overlapping a zeroing write: {hit}")
# A punted write is issued by the worker after the lock it waited for is free: within
# 100 us of a zeroing write's end.
after = sum(any(b <= t <= b + 1e-4 or a <= t <= b for a, b in spans) for t in by_worker)
print(f"data writes issued by io-wq during or within 100 us after a zeroing write: {after} of {len(by_worker)}")
PY
