#!/usr/bin/env python3
"""Cold-read cost of a lower file's layout, without densefs.

layout_sim.py RUN_MB GAP_MB [DIR]: writes 458 MB of random bytes into DIR/sim (default
/tmp/exp/w/lower, an ext4 loop mount) as runs of RUN_MB separated by holes of GAP_MB (the way a
container's copies lie on the lower file), fsyncs, drops the page cache, then reads the data runs
in order (SEEK_DATA / SEEK_HOLE, 1 MiB preads) and prints the seconds. Run as root.
"""
import os, sys, time
run=int(float(sys.argv[1])*(1<<20)); gap=int(float(sys.argv[2])*(1<<20)); total=458<<20
p=os.path.join(sys.argv[3] if len(sys.argv) > 3 else '/tmp/exp/w/lower', 'sim')
fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)
buf=os.urandom(1<<20); off=0; done=0
while done<total:
    n=min(run,total-done); w=0
    while w<n:
        k=min(len(buf),n-w); os.pwrite(fd,buf[:k],off+w); w+=k
    off+=run+gap; done+=n
os.fsync(fd); os.close(fd)
os.system("echo 3 > /proc/sys/vm/drop_caches")
fd=os.open(p,os.O_RDONLY); size=os.fstat(fd).st_size
t=time.time(); off=0; n=0
while off<size:
    try: d=os.lseek(fd,off,os.SEEK_DATA)
    except OSError: break
    h=os.lseek(fd,d,os.SEEK_HOLE)
    while d<h:
        k=min(1<<20,h-d); n+=len(os.pread(fd,k,d)); d+=k
    off=h
print("run %s MB gap %s MB: cold read %.2f s (%d MB)"%(sys.argv[1],sys.argv[2],time.time()-t,n>>20))
os.unlink(p)
