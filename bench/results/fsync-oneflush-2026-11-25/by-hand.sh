#!/bin/bash
# fio 4K random writes, each fsync'd, 10 s per run: densefs lz4 before/after (lower: a directory
# on this machine's root ext4, no loop device) and btrfs lzo on a loop device, three rounds.
# Usage: by-hand.sh BEFORE_BIN AFTER_BIN (run as root, from an empty scratch directory).
set -u
mkdir -p low mnt bt
[ -f btrfs.img ] || { truncate -s 2G btrfs.img; mkfs.btrfs -q btrfs.img; }
mountpoint -q bt || mount -o loop,compress-force=lzo btrfs.img bt
fio_run() {
  fio --output-format=json --name=l --filename="$1/f.dat" --size=64M --rw=write --bs=1M --ioengine=psync --fallocate=none --end_fsync=1 >/dev/null
  fio --output-format=json --name=fs --filename="$1/f.dat" --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync \
    --fallocate=none --overwrite=1 --time_based=1 --runtime=10 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'
  rm -f "$1/f.dat"
}
densefs_run() { # label binary
  rm -rf low/*; "$2" mount -o compression=lz4 low mnt 2>/dev/null; sleep 0.5
  echo "$1 $(fio_run mnt)"; fusermount3 -u mnt
}
for round in 1 2 3; do
  densefs_run before "$1"
  densefs_run after "$2"
  echo "btrfs-lzo $(fio_run bt)"
done
umount bt
