#!/usr/bin/env bash
# Before/after in one run: builds revision REV (default: main's previous commit) in a
# temporary worktree and this checkout, then runs perf/e2e.sh for each, alternating
# (before, after, before, after), so both see the same machine on the same day. Each runs
# its own ringmq-bench (the protocol version may differ). SHARDS and TOKIO_WORKER_THREADS
# (the bench's threads) pass through to perf/e2e.sh. BENCH=after runs this tree's bench for
# both sides (when the protocol is unchanged: the same load generator, options REV's bench
# lacks such as --warmup).
# Usage: perf/compare.sh REV [SECONDS_PER_CASE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: perf/compare.sh REV [SECONDS_PER_CASE] [ROUNDS]}
SECS=${2:-5}
ROUNDS=${3:-2}
WT=$(mktemp -d /tmp/ringmq-before.XXXX)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$WT" "$REV" >/dev/null 2>&1
echo "building $REV (before) and the working tree (after)..."
(cd "$WT" && CARGO_TARGET_DIR=/tmp/ringmq-before-target cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1)
cargo build --release --bin ringmq-broker --bin ringmq-bench >/dev/null 2>&1
# Both sides measure alike: without BENCH=after, a REV whose bench has no --warmup means
# no warm-up for either side.
if [ "${BENCH:-}" != after ] && ! /tmp/ringmq-before-target/release/ringmq-bench --help | grep -q -- --warmup; then
  export RINGMQ_NO_WARMUP=1
fi
for round in $(seq "$ROUNDS"); do
  echo "=== round $round: before ($(git rev-parse --short "$REV"))"
  before_bench=/tmp/ringmq-before-target/release
  [ "${BENCH:-}" = after ] && before_bench=target/release
  RINGMQ_BIN=/tmp/ringmq-before-target/release RINGMQ_BENCH_BIN=$before_bench RINGMQ_OUT=perf/out/before perf/e2e.sh "$SECS"
  echo "=== round $round: after (working tree of $(git rev-parse --short HEAD))"
  RINGMQ_BIN=target/release RINGMQ_OUT=perf/out/after perf/e2e.sh "$SECS"
done
