#!/bin/bash
# coldab.sh REPS [write] : cold `cat` of a 1 GiB FASTQ stored by format 3 (4077e41's binary) and by
# format 4 on the same ext4 lower, and on btrfs lzo, in turns. `write` first writes both files
# (and btrfs's) through each binary. Paths are those of the session that ran it.
W=/tmp/exp/w; B=/tmp/exp/bt; SRC=/var/tmp/densefs-bench/full/data/reads-1024M.fastq
V3=/tmp/exp/densefs-4077; V4=/tmp/exp/densefs-v4
mountpoint -q $B/mnt || mount -o loop,compress-force=lzo $B/img $B/mnt
if [ "$2" = write ]; then
  rm -rf $W/lower/*; sync
  $V3 mount -o compression=lz4 $W/lower $W/mnt 2>/dev/null; cp $SRC $W/mnt/f3; $V3 umount $W/mnt
  $V4 mount -o compression=lz4 $W/lower $W/mnt 2>/dev/null; cp $SRC $W/mnt/f4; $V4 umount $W/mnt
  [ -f $B/mnt/r ] || cp $SRC $B/mnt/r; sync
  ls -ls $W/lower; filefrag $W/lower/f3 $W/lower/f4
fi
t() { echo 3 > /proc/sys/vm/drop_caches; local s=$(date +%s.%N); cat $1 > /dev/null; local e=$(date +%s.%N); echo "$(echo "$e - $s" | bc)"; }
for r in $(seq $1); do
  $V3 mount $W/lower $W/mnt 2>/dev/null; a=$(t $W/mnt/f3); $V3 umount $W/mnt
  $V4 mount $W/lower $W/mnt 2>/dev/null; b=$(t $W/mnt/f4); $V4 umount $W/mnt
  c=$(t $B/mnt/r)
  echo "rep $r: format 3 $a s, format 4 $b s, btrfs lzo $c s"
done
umount $B/mnt
