#!/bin/bash
# ab.sh LABEL BIN [opts]: fio 4k randwrite fsync=1 5 s on densefs over a loop ext4 lower
cd /var/tmp/fs1
label=$1; bin=$2; opts=${3:-compression=lz4}
mountpoint -q low || mount -o loop ext4.img low
rm -rf low/* low/.densefs* 2>/dev/null
$bin mount -o $opts low mnt 2>/dev/null; sleep 0.3
fio --output-format=json --name=l --filename=mnt/f.dat --size=64M --rw=write --bs=1M --ioengine=psync --fallocate=none --end_fsync=1 >/dev/null
iops=$(fio --output-format=json --name=fs --filename=mnt/f.dat --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync --fallocate=none --overwrite=1 --time_based=1 --runtime=5 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))')
fusermount3 -u mnt
echo "$label $iops"
