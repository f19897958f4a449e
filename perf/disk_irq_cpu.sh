#!/usr/bin/env bash
# Prints the CPU that has taken the most completion interrupts of the disk holding DIR
# (default: .), or nothing when that cannot be told (no such interrupts listed, a device
# that is not a disk). A disk with one hardware queue (a virtio disk on a small VM) sends
# every completion to one CPU: a shard pinned there (`ringmq-broker --cpus CPU`) is
# interrupted in place rather than woken from another CPU for every write.
# Usage: perf/disk_irq_cpu.sh [DIR]
set -euo pipefail
dir=${1:-.}
src=$(df --output=source "$dir" 2>/dev/null | tail -1)
dev=$(basename "$src")
parent=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1 || true)
[ -n "$parent" ] && dev=$parent
[ -e "/sys/block/$dev" ] || exit 0
# Interrupt names: virtio disks name theirs after the virtio device (virtio1-req.0), NVMe
# after the controller (nvme0q1); others after the disk itself.
ctrl=$(basename "$(readlink -f "/sys/block/$dev/device")")
case "$ctrl" in
  virtio*) pattern="$ctrl-req" ;;
  *) pattern=$(echo "$dev" | sed -E 's/n[0-9]+$//') ;;
esac
awk -v pat="$pattern" '
  NR == 1 { ncpu = NF; for (i = 1; i <= NF; i++) name[i] = substr($i, 4); next }
  index($0, pat) { for (i = 1; i <= ncpu; i++) sum[i] += $(i + 1) }
  END {
    best = 0
    for (i = 1; i <= ncpu; i++) if (sum[i] > best) { best = sum[i]; cpu = name[i] }
    if (best > 0) print cpu
  }' /proc/interrupts
