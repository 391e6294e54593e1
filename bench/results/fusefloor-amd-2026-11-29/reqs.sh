#!/bin/bash
# reqs.sh URING CPUS : untar under perf record of fuse request tracepoints
BIN=${BIN:-/work/main/target/release/densefs}; U=$1; CPUS=$2
cd /tmp/exp
mkfs.ext4 -q -F lower.img; mkdir -p low mnt; mount -o loop lower.img low
echo $U > /sys/module/fuse/parameters/enable_uring
TS=""; [ -n "$CPUS" ] && TS="taskset -c $CPUS"
$TS $BIN mount low mnt -o compression=lz4 >/dev/null 2>&1; sleep 0.5
cat tree.tar > /dev/null
perf record -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o req.data -- bash -c "$TS tar xf tree.tar -C mnt; sync" 2>&1 | tail -1
$BIN umount mnt >/dev/null 2>&1 || umount -l mnt; umount low
perf script -i req.data -F time,event,trace 2>/dev/null > req.txt
