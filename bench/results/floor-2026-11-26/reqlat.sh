#!/bin/bash
# reqlat.sh BIN OPTS TAR : per-opcode FUSE request latency (send..end) during an untar
BIN=$1; OPTS=$2; TAR=$3; W=/tmp/exp/w; T=/sys/kernel/tracing
rm -rf $W/lower/*; sync
$BIN mount -o $OPTS $W/lower $W/mnt 2>/dev/null
mkdir $W/mnt/tree
echo > $T/trace; echo 1 > $T/events/fuse/fuse_request_send/enable; echo 1 > $T/events/fuse/fuse_request_end/enable
s=$(date +%s.%N); tar xf $TAR -C $W/mnt/tree; e=$(date +%s.%N)
echo 0 > $T/events/fuse/fuse_request_send/enable; echo 0 > $T/events/fuse/fuse_request_end/enable
printf "untar (no sync) %.2f\n" $(echo "$e - $s" | bc)
cp $T/trace /tmp/exp/lat.trace
$BIN umount $W/mnt
python3 - <<'PY'
import re, collections
send={}; lat=collections.defaultdict(list)
for l in open('/tmp/exp/lat.trace'):
    m=re.search(r'\s(\d+\.\d+): fuse_request_(send|end): connection \d+ req (\d+) (?:opcode \d+ \((\w+)\))?', l)
    if not m: continue
    t=float(m.group(1)); kind=m.group(2); req=m.group(3)
    if kind=='send': send[req]=(t,m.group(4))
    elif req in send:
        t0,op=send.pop(req); lat[op].append((t-t0)*1e6)
tot=0
for op,v in sorted(lat.items(), key=lambda x:-sum(x[1])):
    v.sort(); tot+=sum(v)
    print(f"{op:16s} n={len(v):6d} mean={sum(v)/len(v):7.1f}us p50={v[len(v)//2]:7.1f} p90={v[int(len(v)*.9)]:7.1f} total={sum(v)/1e6:.3f}s")
print("sum of latencies", tot/1e6)
PY
