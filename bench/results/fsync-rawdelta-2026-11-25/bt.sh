#!/bin/bash
cd /var/tmp/fs1
fio --output-format=json --name=l --filename=bt/f.dat --size=64M --rw=write --bs=1M --ioengine=psync --fallocate=none --end_fsync=1 >/dev/null
iops=$(fio --output-format=json --name=fs --filename=bt/f.dat --size=64M --rw=randwrite --bs=4k --fsync=1 --ioengine=psync --fallocate=none --overwrite=1 --time_based=1 --runtime=5 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))')
rm -f bt/f.dat; echo "btrfs $iops"
