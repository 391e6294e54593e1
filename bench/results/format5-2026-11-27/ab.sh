#!/bin/bash
# ab.sh BIN ALG FILE: copy FILE in (timed, with sync), show the lower file's length and blocks, cold read (timed)
BIN=$1; ALG=$2; F=$3
L=/tmp/exp/w/lower; M=/tmp/exp/w/mnt
rm -rf $L/* ; sync
$BIN mount -o compression=$ALG $L $M 2>/dev/null; sleep 0.5
s=$(date +%s.%N); cp $F $M/f; sync; e=$(date +%s.%N)
cp_t=$(echo "$e - $s" | bc)
fusermount3 -u $M; sleep 0.5
len=$(stat -c %s $L/f); alloc=$(( $(stat -c %b $L/f) * 512 ))
$BIN mount -o compression=$ALG $L $M 2>/dev/null; sleep 0.5
sync; echo 3 > /proc/sys/vm/drop_caches
s=$(date +%s.%N); cat $M/f > /dev/null; e=$(date +%s.%N)
rd_t=$(echo "$e - $s" | bc)
cmp -s $F $M/f && ok=same || ok=DIFFERENT
fusermount3 -u $M
echo "$(basename $BIN) $ALG copy ${cp_t}s lower_len $len alloc $alloc coldread ${rd_t}s $ok"
