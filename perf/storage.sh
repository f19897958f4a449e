#!/usr/bin/env bash
# Storage engine figures against the disk itself, in one run:
#   fio sequential O_DIRECT writes (1 KiB, 64 KiB, 1 MiB blocks) and fio's fdatasync latency,
#   then ringmq's commit log append throughput (1 KiB and 16 KiB records; async; sync with
#   1, 16 and 64 concurrent appenders) and the recovery scan, with the ratios.
# Usage: perf/storage.sh [DIR]   (DIR on the disk to measure; default: a temp dir under /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
cargo build --release --bin ringmq-storage-demo >/dev/null 2>&1
BIN=target/release/ringmq-storage-demo
DIR=$(mktemp -d "${1:-/tmp}/ringmq-perf.XXXX")
trap 'rm -rf "$DIR"' EXIT

fio_bw() { # block size -> MB/s of sequential direct writes
  fio --name=w --filename="$DIR/fio" --rw=write --bs="$1" --size=1g --direct=1 \
      --ioengine=io_uring --iodepth=1 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['write']['bw_bytes']/1e6,1))"
  rm -f "$DIR/fio"
}
fio_sync() { # fdatasync latency percentiles (us) after 1 KiB writes into a laid-out file
  fio --name=s --filename="$DIR/fio" --rw=write --bs=1k --size=16m --direct=1 --ioengine=sync \
      --fdatasync=1 --output-format=json 2>/dev/null |
    python3 -c "import json,sys; p=json.load(sys.stdin)['jobs'][0]['sync']['lat_ns']['percentile']; print(' '.join(str(round(p[k]/1000)) for k in ('50.000000','99.000000','99.900000')))"
  rm -f "$DIR/fio"
}
ring() { # flush size appenders records -> MB/s
  rm -rf "$DIR/r"
  $BIN --data-dir "$DIR/r" --flush "$1" --segment-bytes 1073741824 bench-append \
      --size "$2" --appenders "$3" --records "$4" |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(j['mb_per_sec'], j['records_per_sec'])"
}

F1K=$(fio_bw 1k); F64K=$(fio_bw 64k); F1M=$(fio_bw 1m)
read -r S50 S99 S999 <<<"$(fio_sync)"
echo "machine: $(nproc) cores, $(uname -r), $(df -hT "$DIR" | awk 'NR==2{print $2" on "$1}')"
echo "fio sequential O_DIRECT write MB/s: bs=1k $F1K  bs=64k $F64K  bs=1m $F1M"
echo "fio fdatasync latency after 1 KiB writes (us): p50 $S50 p99 $S99 p99.9 $S999"
printf '%-34s %12s %12s %14s\n' case MB/s rec/s "vs fio 1m"
row() {
  read -r mb recs <<<"$(ring "$2" "$3" "$4" "$5")"
  printf '%-34s %12s %12s %13s%%\n' "$1" "$mb" "$recs" "$(python3 -c "print(round(100*$mb/$F1M))")"
}
row "async 1KiB (pipelined)"       async 1024  1  2000000
row "async 16KiB (pipelined)"      async 16384 1  200000
row "sync 1KiB, 1 appender"        sync  1024  1  5000
row "sync 1KiB, 16 appenders"      sync  1024  16 100000
row "sync 1KiB, 64 appenders"      sync  1024  64 300000
row "sync 16KiB, 64 appenders"     sync  16384 64 50000
rm -rf "$DIR/r"
$BIN --data-dir "$DIR/r" --segment-bytes 268435456 bench-append --size 1024 --records 2000000 >/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
$BIN --data-dir "$DIR/r" --segment-bytes 268435456 bench-recovery |
  python3 -c "import json,sys; j=json.load(sys.stdin); print('recovery scan (verify all, O_DIRECT reads):', j['mb_per_sec'], 'MB/s over', j['bytes'], 'bytes')"
