BIN=$1; F=$2; W=/tmp/exp/w
$BIN mount $W/lower $W/mnt 2>/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
PID=$(pgrep -f "$BIN mount" | head -1)
a=$(awk '{print $14+$15}' /proc/$PID/stat); read -r _ u1 n1 s1 i1 w1 q1 sq1 rest < /proc/stat
s=$(date +%s.%N); cat $W/mnt/$F > /dev/null; e=$(date +%s.%N)
b=$(awk '{print $14+$15}' /proc/$PID/stat); read -r _ u2 n2 s2 i2 w2 q2 sq2 rest < /proc/stat
printf "cold %.2f daemon %.2f busy %.2f idle %.2f iowait %.2f\n" $(echo "$e - $s" | bc) $(echo "($b - $a)/100" | bc -l) $(echo "($u2+$s2+$q2+$sq2-$u1-$s1-$q1-$sq1)/100" | bc -l) $(echo "($i2-$i1)/100" | bc -l) $(echo "($w2-$w1)/100" | bc -l)
$BIN umount $W/mnt
