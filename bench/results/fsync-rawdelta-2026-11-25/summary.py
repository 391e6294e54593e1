import json, statistics, sys
base = sys.argv[1]
pairs = [("densefs-lz4", "btrfs-lzo"), ("densefs-gzip-6", "btrfs-zlib6"), ("densefs-zstd-3", "btrfs-zstd3")]
rows = {}
for which in ("before", "after"):
    for i in range(1, 5):
        try:
            d = json.load(open(f"{base}/{which}-{i}/results.json"))
        except FileNotFoundError:
            continue
        iops = {r["system"]: r["iops"] for r in d["fsync"] if "iops" in r}
        lat = {r["system"]: r.get("fsync_lat_us") for r in d["fsync"] if "iops" in r}
        for a, b in pairs:
            rows.setdefault((which, a), []).append((iops[a] / iops[b], iops[a], iops[b], lat[a]))
for (which, a), v in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0] != "before")):
    ratios = [r[0] for r in v]
    print(f"{which:6} {a:15} ratios {' '.join(f'{r:.2f}' for r in ratios)}  median {statistics.median(ratios):.2f}  "
          f"densefs IOPS {' '.join(f'{r[1]:.0f}' for r in v)}  btrfs {' '.join(f'{r[2]:.0f}' for r in v)}  fsync us {' '.join(f'{r[3]:.0f}' for r in v)}")
