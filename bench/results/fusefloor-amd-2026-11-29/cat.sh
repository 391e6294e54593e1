#!/bin/bash
# cat.sh URING : untar, remount, drop caches, then trace ls -lR and cat of every file
BIN=${BIN:-/work/main/target/release/densefs}; U=$1
cd /tmp/exp
mkfs.ext4 -q -F lower.img; mkdir -p low mnt; mount -o loop lower.img low
echo $U > /sys/module/fuse/parameters/enable_uring
$BIN mount low mnt -o compression=lz4 >/dev/null 2>&1; sleep 0.3
tar xf tree.tar -C mnt; $BIN umount mnt; sync; echo 3 > /proc/sys/vm/drop_caches
$BIN mount low mnt -o compression=lz4 >/dev/null 2>&1; sleep 0.3
perf record -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o ls.data -- bash -c "ls -lR mnt > /dev/null" 2>&1 | tail -1
$BIN umount mnt; echo 3 > /proc/sys/vm/drop_caches
$BIN mount low mnt -o compression=lz4 >/dev/null 2>&1; sleep 0.3
perf record -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o cat.data -- bash -c "find mnt -type f -print0 | xargs -0 cat > /dev/null" 2>&1 | tail -1
$BIN umount mnt; umount low
perf script -i ls.data -F time,event,trace 2>/dev/null > ls.txt
perf script -i cat.data -F time,event,trace 2>/dev/null > cat.txt
