import sys, re, collections
sent = {}
tot = collections.Counter(); cnt = collections.Counter(); lat=collections.defaultdict(list)
first=last=None
for line in open(sys.argv[1]):
    m = re.match(r'\s*([\d.]+):\s+fuse:(\w+): connection \d+ req (\d+)(?: opcode \d+ \((\w+)\))?', line)
    if not m: continue
    t=float(m.group(1)); ev=m.group(2); rid=m.group(3)
    first = first or t; last=t
    if ev=='fuse_request_send': sent[rid]=(t,m.group(4))
    elif rid in sent:
        t0,op=sent.pop(rid); d=t-t0; tot[op]+=d; cnt[op]+=1; lat[op].append(d)
span=last-first
print(f"span {span:.2f}s requests {sum(cnt.values())} in-request {sum(tot.values()):.2f}s")
for op,v in tot.most_common():
    l=sorted(lat[op]); print(f"{op:20s} n={cnt[op]:7d} sum={v:6.2f}s median={l[len(l)//2]*1e6:6.1f}us p90={l[int(len(l)*.9)]*1e6:7.1f}us")
