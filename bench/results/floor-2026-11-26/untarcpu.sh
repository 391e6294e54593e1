#!/bin/bash
# untarcpu.sh BIN OPTS TAR : untar with CPU split (daemon / tar / all busy) and strace -c of the daemon optional
BIN=$1; OPTS=$2; TAR=$3; W=/tmp/exp/w
rm -rf $W/lower/*; sync
$BIN mount -o $OPTS $W/lower $W/mnt 2>/dev/null
PID=$(pgrep -f "$BIN mount" | head -1)
mkdir $W/mnt/tree
a=$(awk '{print $14+$15}' /proc/$PID/stat); read -r _ u1 n1 s1 i1 w1 q1 sq1 rest < /proc/stat
s=$(date +%s.%N); /usr/bin/time -f "tar user %U sys %S" tar xf $TAR -C $W/mnt/tree; m=$(date +%s.%N); sync; e=$(date +%s.%N)
b=$(awk '{print $14+$15}' /proc/$PID/stat); read -r _ u2 n2 s2 i2 w2 q2 sq2 rest < /proc/stat
printf "untar %.2f (tar %.2f) daemon %.2f busy %.2f idle %.2f iowait %.2f\n" $(echo "$e - $s" | bc) $(echo "$m - $s" | bc) $(echo "($b - $a)/100" | bc -l) $(echo "($u2+$s2+$q2+$sq2-$u1-$s1-$q1-$sq1)/100" | bc -l) $(echo "($i2-$i1)/100" | bc -l) $(echo "($w2-$w1)/100" | bc -l)
$BIN umount $W/mnt
