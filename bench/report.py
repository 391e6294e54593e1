#!/usr/bin/env python3
"""report.md and PNG plots from bench/run's results.json.  Re-render: bench/report.py RESULTS.json [OUTDIR]"""
import json
import sys
from pathlib import Path

COLORS = {"bare": "#7f7f7f", "bindfs": "#9467bd", "densefs": "#1f77b4", "btrfs": "#ff7f0e", "zfs-fuse": "#2ca02c"}


# Each peer beside densefs at the same (or the nearest) algorithm.
GROUPS = [
    ("none", ["bare", "bindfs", "densefs-off"]),
    ("lz4 / lzo", ["densefs-lz4", "btrfs-lzo"]),
    ("gzip-1", ["densefs-gzip-1", "btrfs-zlib1", "zfs-gzip-1"]),
    ("gzip-6", ["densefs-gzip-6", "btrfs-zlib6", "zfs-gzip-6"]),
    ("gzip-9", ["densefs-gzip-9", "btrfs-zlib9", "zfs-gzip-9"]),
    ("zstd-1", ["densefs-zstd-1", "btrfs-zstd1"]),
    ("zstd-3", ["densefs-zstd-3", "btrfs-zstd3"]),
    ("lzjb", ["densefs-lzjb", "zfs-lzjb"]),
    ("zle", ["densefs-zle", "zfs-zle"]),
]


WORKLOADS = ("smallfiles", "bigread", "fsync")
EXPERIMENTS = ("copy", "read", "cores", "fio", "app", "cost") + WORKLOADS  # as harness.py's --experiments


def pairs(sys):
    """(densefs id, btrfs id) at the same algorithm (GROUPS), both in this run."""
    out = []
    for _, group in GROUPS:
        d = next((s for s in group if s.startswith("densefs-")), None)
        b = next((s for s in group if s.startswith("btrfs-")), None)
        if d in sys and b in sys:
            out.append((d, b))
    return out


def f2(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def cost_eff(mb_s, ratio, util):
    """QZFS's cost-efficiency: throughput x compression ratio / CPU utilisation."""
    if mb_s is None or ratio is None or not util:
        return None
    return mb_s * ratio / util


def run_list(secs, steals=()):
    """Every run's seconds, e.g. `0.29 0.40 0.44`; a run the VM's host took CPU from (steal, 0.05 s
    or more) says how much: `3.98 (0.6 stolen)`."""
    steals = list(steals) + [0.0] * (len(secs) - len(steals))  # results from before steal was kept
    return " ".join(f"{x:.2f}" + (f" ({t:.1f} stolen)" if t >= 0.05 else "") for x, t in zip(secs, steals))


def runs(rec, what):
    """Every run's seconds of `what` (copy, read) in a copy record."""
    return run_list(rec.get(f"{what}_all_s", []), rec.get(f"{what}_all_steal_s", []))


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


class R:
    """Indexes over results.json."""

    def __init__(self, res):
        self.res = res
        self.sys = res["systems"]
        self.order = list(self.sys)
        self.copy = {(c["system"], c["cores"], c["data"]): c for c in res["copy"] if "copy" in c and "read" in c}
        self.cores = sorted({c["cores"] for c in res["copy"]}, reverse=True)
        self.n = self.cores[0] if self.cores else None

    def name(self, sid):
        return self.sys[sid]["name"]

    def color(self, sid):
        return COLORS.get(self.sys[sid]["family"], "#333333")

    def rel(self, sid, cores, data, what):
        """`what` (copy/read) seconds relative to the bare directory in the same run and phase."""
        c, b = self.copy.get((sid, cores, data)), self.copy.get(("bare", cores, data))
        if not c or not b:
            return None
        return c[what]["seconds"] / b[what]["seconds"]

    def systems_with(self, cores, data):
        return [s for s in self.order if (s, cores, data) in self.copy]


def plots(r, out):
    """The seeds' graphs: bar charts per system. Returns the list of PNG names written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return [], f"no plots: matplotlib missing ({e})"
    written = []

    def barh(ax, sids, vals, title, xlabel, ref=None, fmt="{:.2f}"):
        y = range(len(sids))
        v = [x if x is not None else 0 for x in vals]
        ax.barh(list(y), v, color=[r.color(s) for s in sids])
        ax.set_yticks(list(y))
        ax.set_yticklabels([r.name(s) for s in sids], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        if ref is not None:
            ax.axvline(ref, color="k", lw=0.6, ls="--")
        for i, x in enumerate(vals):
            if x is not None:
                ax.text(x, i, " " + fmt.format(x), va="center", fontsize=6)

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
        written.append(name)

    n = r.n
    sids = r.systems_with(n, "fastq")
    if sids:
        fig, axs = plt.subplots(1, 4, figsize=(15, 0.28 * len(sids) + 1.2))
        barh(axs[0], sids, [r.rel(s, n, "fastq", "copy") for s in sids], f"copy time vs bare ({n} cores)",
             "x bare dir (lower is better)", 1)
        barh(axs[1], sids, [r.copy[(s, n, "fastq")]["ratio"] for s in sids], "compression ratio (FASTQ)",
             "logical / physical", 1)
        cpu = [r.copy[(s, n, "fastq")]["copy"] for s in sids]
        barh(axs[2], sids, [c["cpu_busy_s"] for c in cpu], "CPU during copy (all processes)", "CPU seconds",
             fmt="{:.1f}")
        barh(axs[3], sids, [c["fs_cpu_s"] for c in cpu], "CPU of the FS daemon (FUSE ones)", "CPU seconds",
             fmt="{:.1f}")
        save(fig, "copy.png")

        fig, axs = plt.subplots(1, 3, figsize=(12, 0.28 * len(sids) + 1.2))
        barh(axs[0], sids, [r.rel(s, n, "fastq", "read") for s in sids], f"cold read time vs bare ({n} cores)",
             "x bare dir (lower is better)", 1)
        rd = [r.copy[(s, n, "fastq")]["read"] for s in sids]
        barh(axs[1], sids, [c["mb_s"] for c in rd], "cold read throughput", "MB/s (logical)", fmt="{:.0f}")
        barh(axs[2], sids, [c["cpu_busy_s"] for c in rd], "CPU during read", "CPU seconds", fmt="{:.1f}")
        save(fig, "read.png")

        fig, axs = plt.subplots(1, 2, figsize=(11, 0.28 * len(sids) + 1.2))
        barh(axs[0], sids, [cost_eff(r.copy[(s, n, "fastq")]["copy"]["mb_s"], r.copy[(s, n, "fastq")]["ratio"],
                                     r.copy[(s, n, "fastq")]["copy"]["cpu_util"]) for s in sids],
             "cost-efficiency, copy (QZFS)", "MB/s x ratio / CPU utilisation (higher is better)", fmt="{:.0f}")
        barh(axs[1], sids, [cost_eff(r.copy[(s, n, "fastq")]["read"]["mb_s"], r.copy[(s, n, "fastq")]["ratio"],
                                     r.copy[(s, n, "fastq")]["read"]["cpu_util"]) for s in sids],
             "cost-efficiency, cold read (QZFS)", "MB/s x ratio / CPU utilisation", fmt="{:.0f}")
        save(fig, "cost.png")

    if len(r.cores) > 1:
        one = r.cores[-1]
        sids = [s for s in r.systems_with(n, "fastq") if (s, one, "fastq") in r.copy]
        if sids:
            import numpy as np
            fig, axs = plt.subplots(1, 2, figsize=(12, 0.32 * len(sids) + 1.2))
            y = np.arange(len(sids))
            for ax, what in zip(axs, ("copy", "read")):
                for k, (c, off) in enumerate(((n, -0.2), (one, 0.2))):
                    v = [r.copy[(s, c, "fastq")][what]["seconds"] for s in sids]
                    ax.barh(y + off, v, height=0.4, label=f"{c} core{'s' if c > 1 else ''}",
                            color=[r.color(s) for s in sids], alpha=1.0 if k == 0 else 0.45)
                ax.set_yticks(y)
                ax.set_yticklabels([r.name(s) for s in sids], fontsize=7)
                ax.invert_yaxis()
                ax.set_xscale("log")
                ax.set_xlabel("seconds (log; dark: all cores, light: 1 core)", fontsize=8)
                ax.set_title(f"{what} of the FASTQ: {n} cores vs {one}", fontsize=9)
            save(fig, "cores.png")

    others = [d for d in ("random", "fio90") if r.systems_with(n, d)]
    if others:
        import numpy as np
        sids = r.systems_with(n, "fastq")
        fig, ax = plt.subplots(figsize=(7, 0.32 * len(sids) + 1.2))
        y = np.arange(len(sids))
        for k, d in enumerate(["fastq"] + others):
            v = [r.copy.get((s, n, d), {}).get("ratio", 0) for s in sids]
            ax.barh(y + (k - 1) * 0.27, v, height=0.27, label=d)
        ax.set_yticks(y)
        ax.set_yticklabels([r.name(s) for s in sids], fontsize=7)
        ax.invert_yaxis()
        ax.legend(fontsize=7)
        ax.set_title("compression ratio by data", fontsize=9)
        save(fig, "ratios.png")

    fio = [f for f in r.res["fio"] if f.get("jobs")]
    if fio:
        keys = []
        for f in fio:
            for j in f["jobs"]:
                k = (j["rw"], j["bs"], j["iodepth"])
                if k not in keys:
                    keys.append(k)
        rws = [rw for rw in ("write", "randwrite", "read", "randread") if any(k[0] == rw for k in keys)]
        pts = []
        for k in keys:
            if (k[1], k[2]) not in pts:
                pts.append((k[1], k[2]))
        sids = [f["system"] for f in fio]
        fig, axs = plt.subplots(len(rws), len(pts), figsize=(3.6 * len(pts) + 0.5, (0.2 * len(sids) + 0.9) * len(rws)),
                                squeeze=False)
        for i, rw in enumerate(rws):
            for k, (bs, qd) in enumerate(pts):
                vals = []
                for f in fio:
                    j = next((j for j in f["jobs"] if (j["rw"], j["bs"], j["iodepth"]) == (rw, bs, qd)), {})
                    vals.append(j.get("mb_s"))
                barh(axs[i][k], sids, vals, f"fio {rw} bs={bs} iodepth={qd}", "MB/s", fmt="{:.0f}")
                if k:
                    axs[i][k].set_yticklabels([])
        save(fig, "fio.png")

    sam = [s for s in r.res["samtools"] if "seconds" in s]
    base = next((s["seconds"] for s in sam if s["system"] == "densefs-off"), None)
    if sam and base:
        fig, ax = plt.subplots(figsize=(6, 0.28 * len(sam) + 1.2))
        barh(ax, [s["system"] for s in sam], [s["seconds"] / base for s in sam],
             "samtools sort -@2: time vs densefs off", "x densefs off (lower is better)", 1)
        save(fig, "samtools.png")
    return written, None


def make(res, out):
    out = Path(out)
    r = R(res)
    m = res["meta"]
    n = r.n
    md = []
    md.append("# densefs benchmarks beside real peers\n")
    ex = m.get("experiments")
    only = f" (experiments: {', '.join(ex)})" if ex and set(ex) != set(EXPERIMENTS) else ""
    md.append(f"Run `{m['mode']}`{only} started {m['started']} on {m['host']}: {m['cpus']} × {m['cpu_model']}, "
              f"{m['mem_gib']} GiB; took {m.get('seconds', 0):.0f} s. Produced by `bench/run` "
              "(bench/harness.py); re-render with `bench/report.py results.json`.\n")
    v = m.get("versions", {})
    if v:
        md.append("Versions: " + ", ".join(f"{k} {x}" for k, x in v.items() if x) + ".\n")
    d = m.get("data", {})
    if d:
        about = {"fastq": "the FASTQs hold real Illumina reads (`samtools fastq` of Debian's drop-seq-testdata BAMs)",
                 "fio90": "`fio90` is fio's 90%-compressible fill (per 16 KiB: 90% zeros, 10% random)",
                 "sam": "the SAM is `samtools view -h` of the largest BAM",
                 "tree": "the tree is a tar of directories of this machine (section 7)"}
        if "big" in d and "fastq" not in d:
            about["big"] = about["fastq"]
        text = "; ".join(v for k, v in about.items() if k in d)
        md.append("Data: " + "; ".join(f"{k} `{x['file']}` {x['bytes'] / 1e6:.1f} MB" for k, x in d.items()) +
                  ". " + text[:1].upper() + text[1:] + ".\n")
    idle = m.get("idle") or {}
    if idle.get("cpuidle_driver"):
        poll = idle.get("guest_halt_poll_ns")
        md.append(f"Idle cores: cpuidle driver `{idle['cpuidle_driver']}`, governor `{idle.get('cpuidle_governor')}`" +
                  (f", guest halt polling {poll} ns" + (" (off: a woken core leaves a halt, which the host handles)"
                                                        if poll == "0" else "") if poll is not None else "") + ".\n")
    if res.get("fuse_io_uring"):
        md.append(f"FUSE over io_uring: {res['fuse_io_uring']} (densefs uses it unless mounted `io_uring=off`, "
                  "the `/dev/fuse` rows).\n")
    if "loadavg_start" in m:
        md.append(f"Load average (1, 5, 15 min) at the start {', '.join(f'{x:.1f}' for x in m['loadavg_start'])}, "
                  f"at the end {', '.join(f'{x:.1f}' for x in m.get('loadavg_end', []))}: other work on the "
                  "machine shows up as noise.\n")
    if "steal_s" in m:
        md.append(f"CPU the VM's host took from this machine's cores while the run went on (steal, /proc/stat): "
                  f"{m['steal_s']:.1f} s. A run it took 0.05 s or more from says so in its `runs` cell "
                  "(`3.98 (0.6 stolen)`): it was slowed by other guests, not by the file system.\n")
    md.append("Times vary on this shared machine: compare the ratios to the bare directory of the same run, "
              "not absolute seconds across runs. CPU is from /proc/stat over the cores in use (user+sys, "
              "as dstat), and `FS cpu` is the file system's own process (utime+stime of the densefs / "
              "bindfs / zfs-fuse daemon; btrfs compresses in kernel threads, counted only in the total). "
              "Cost-efficiency is QZFS's: throughput (MB/s of logical data) × compression ratio / CPU "
              "utilisation (fraction of the cores in use).\n")
    if res["skipped"]:
        md.append("## Skipped\n")
        md.append(table(["system", "reason"], [[r.name(s["system"]) if s["system"] in r.sys else s["system"],
                                                s["reason"].replace("|", "/")] for s in res["skipped"]]))
    errs = [c for c in res["copy"] if "error" in c] + [f for f in res["fio"] if f.get("error")] + \
        [s for s in res["samtools"] if "error" in s] + [x for k in WORKLOADS for x in res.get(k, []) if "error" in x]
    if errs:
        md.append("## Errors\n")
        md.append(table(["system", "cores", "what", "error"], [
            [r.name(e["system"]), e.get("cores"), e.get("data") or e.get("experiment") or
             ("fio" if "jobs" in e else "samtools"),
             str(e["error"]).replace("|", "/").replace("\n", " ")[:200]] for e in errs]))

    written, why = plots(r, out)
    sids = r.systems_with(n, "fastq")
    sam = {x["system"]: x["seconds"] for x in res["samtools"] if "seconds" in x}
    one = r.cores[-1] if len(r.cores) > 1 else None
    rows = []
    for alg, group in GROUPS:
        for s in group:
            c = r.copy.get((s, n, "fastq"))
            if not c:
                continue
            rows.append([alg, r.name(s), f2(c["ratio"]), f2(r.rel(s, n, "fastq", "copy")),
                         f2(r.rel(s, one, "fastq", "copy")) if one else "–", f2(r.rel(s, n, "fastq", "read")),
                         f2(c["copy"]["cpu_busy_s"], 1), f2(c["copy"]["fs_cpu_s"], 1),
                         f2(sam[s] / sam["densefs-off"]) if s in sam and sam.get("densefs-off") else "–",
                         f2(cost_eff(c["copy"]["mb_s"], c["ratio"], c["copy"]["cpu_util"]), 0)])
    if rows:
        md.append("## Summary: densefs beside each peer at the same algorithm (FASTQ)\n")
        md.append("Times are relative to the bare directory in the same run and phase (lower is better); CPU "
                  f"seconds are for the copy on {n} cores.\n")
        md.append(table(["algorithm", "system", "ratio", f"copy vs bare, {n} cores",
                         f"copy vs bare, {one} core" if one else "copy vs bare, 1 core", "cold read vs bare",
                         "copy CPU s", "FS daemon CPU s", "samtools sort vs densefs off", "copy cost-eff."], rows))
    if sids:
        md.append(f"## 1. Copy: `cp` the FASTQ from page cache, fsync + sync included ({n} cores)\n")
        if m["args"].get("reps", 1) > 1:
            md.append(f"Copy and read are repeated {m['args']['reps']} times where the first copy + read took "
                      f"under {m['args']['rep_limit']} s; the tables show the best run (other work on this shared "
                      "machine only adds time) and `runs` lists them all.\n")
        rows = []
        for s in sids:
            c = r.copy[(s, n, "fastq")]
            k = c["copy"]
            rows.append([r.name(s), f2(k["seconds"]), f2(k["mb_s"], 0), f2(r.rel(s, n, "fastq", "copy")),
                         f2(c["ratio"]), f"{k['cpu_user_s']:.1f} / {k['cpu_sys_s']:.1f}", f"{k['cpu_util'] * 100:.0f}%",
                         f2(k["fs_cpu_s"], 1), f2(cost_eff(k["mb_s"], c["ratio"], k["cpu_util"]), 0),
                         runs(c, "copy")])
        md.append(table(["system", "s", "MB/s", "time vs bare", "ratio", "CPU user / sys s", "CPU util",
                         "FS cpu s", "cost-eff.", "runs s"], rows))
        if "copy.png" in written:
            md.append("![copy](copy.png)\n")
        md.append(f"## 2. Cold read: caches dropped, `cat FILE > /dev/null` ({n} cores)\n")
        md.append("The daemons' own caches are dropped too: densefs and bindfs are remounted, the zfs-fuse pool "
                  "is exported and imported (its ARC lives in the daemon).\n")
        rows = []
        for s in sids:
            c = r.copy[(s, n, "fastq")]
            k = c["read"]
            rows.append([r.name(s), f2(k["seconds"]), f2(k["mb_s"], 0), f2(r.rel(s, n, "fastq", "read")),
                         f"{k['cpu_user_s']:.1f} / {k['cpu_sys_s']:.1f}", f"{k['cpu_util'] * 100:.0f}%",
                         f2(k["fs_cpu_s"], 1), f2(cost_eff(k["mb_s"], c["ratio"], k["cpu_util"]), 0),
                         runs(c, "read")])
        md.append(table(["system", "s", "MB/s", "time vs bare", "CPU user / sys s", "CPU util", "FS cpu s",
                         "cost-eff.", "runs s"], rows))
        if "read.png" in written:
            md.append("![read](read.png)\n")

    if len(r.cores) > 1:
        one = r.cores[-1]
        both = [s for s in sids if (s, one, "fastq") in r.copy]
        md.append(f"## 3. Fewer cores: {one} core vs {n} (the seeds' 4-core vs 32-core runs)\n")
        md.append(f"Everything pinned with taskset: the harness, `cp`/`cat`, the daemons (started pinned) and the "
                  "kernel's unbound workqueues (where btrfs compresses), through "
                  "/sys/devices/virtual/workqueue/cpumask, restored afterwards.\n")
        rows = []
        for s in both:
            a, b = r.copy[(s, one, "fastq")], r.copy[(s, n, "fastq")]
            rows.append([r.name(s), f2(a["copy"]["seconds"]), f2(b["copy"]["seconds"]),
                         f2(a["copy"]["seconds"] / b["copy"]["seconds"]), f2(r.rel(s, one, "fastq", "copy")),
                         f2(a["read"]["seconds"]), f2(b["read"]["seconds"]),
                         f2(a["read"]["seconds"] / b["read"]["seconds"]), f2(r.rel(s, one, "fastq", "read")),
                         runs(a, "copy"), runs(a, "read")])
        md.append(table(["system", f"copy s, {one} core", f"copy s, {n} cores", "copy 1c / Nc",
                         "copy vs bare, 1 core", f"read s, {one} core", f"read s, {n} cores", "read 1c / Nc",
                         "read vs bare, 1 core", "1-core copy runs s", "1-core read runs s"], rows))
        if "cores.png" in written:
            md.append("![cores](cores.png)\n")

    if any(r.systems_with(n, x) for x in ("random", "fio90")):
        md.append(f"## Other data: incompressible (random) and fio's 90%-compressible buffer ({n} cores)\n")
        rows = []
        for s in sids:
            row = [r.name(s)]
            for x in ("fastq", "random", "fio90"):
                c = r.copy.get((s, n, x))
                row += [f2(c["ratio"]) if c else "–", f2(r.rel(s, n, x, "copy")), f2(r.rel(s, n, x, "read"))]
            rows.append(row)
        md.append(table(["system", "FASTQ ratio", "copy vs bare", "read vs bare", "random ratio", "copy vs bare",
                         "read vs bare", "fio90 ratio", "copy vs bare", "read vs bare"], rows))
        if "ratios.png" in written:
            md.append("![ratios](ratios.png)\n")

    fio = [f for f in res["fio"] if f.get("jobs")]
    if fio:
        md.append("## 4. fio (NoLoad's runs: libaio, direct=1, buffer_compress_percentage=90, "
                  "buffer_compress_chunk=16K)\n")
        md.append(f"File {m['fio_size']} laid out once with 90%-compressible data, then each job "
                  f"{m['fio_runtime_s']} s, time-based; reads after the writes, caches dropped before each. "
                  "`file ratio` is the ratio of fio's file after the layout. btrfs turns O_DIRECT on a compressing "
                  "mount into buffered I/O (so its reads come from the page cache), and bindfs clears O_DIRECT. "
                  "Grid here: " +
                  ", ".join(f"bs={b} iodepth={q}" for b, q in m["fio_grid"]) +
                  (" (the full grid: `bench/run --full-fio`)" if m["mode"] != "full-fio" else "") + ".\n")
        jobs = []
        for f in fio:
            for j in f["jobs"]:
                k = (j["rw"], j["bs"], j["iodepth"])
                if k not in jobs:
                    jobs.append(k)
        bare = next((f for f in fio if f["system"] == "bare"), None)
        rows = []
        for f in fio:
            row = [r.name(f["system"]), f2(f.get("file_ratio"))]
            for k in jobs:
                j = next((j for j in f["jobs"] if (j["rw"], j["bs"], j["iodepth"]) == k), {})
                if "mb_s" in j:
                    row.append(f"{j['mb_s']:.0f} MB/s, {j['iops']:.0f} IOPS")
                else:
                    row.append("error" if j else "–")
            rows.append(row)
        md.append(table(["system", "file ratio"] + [f"{a} {b} qd{c}" for a, b, c in jobs], rows))
        if bare:
            md.append("Throughput relative to the bare directory, and cost-efficiency (MB/s × file ratio / CPU "
                      "utilisation):\n")
            rows = []
            for f in fio:
                row = [r.name(f["system"])]
                for k in jobs:
                    j = next((j for j in f["jobs"] if (j["rw"], j["bs"], j["iodepth"]) == k), {})
                    b = next((j for j in bare["jobs"] if (j["rw"], j["bs"], j["iodepth"]) == k), {})
                    if "mb_s" in j and b.get("mb_s"):
                        ce = cost_eff(j["mb_s"], f.get("file_ratio"), j["cpu_util"])
                        row.append(f"{j['mb_s'] / b['mb_s']:.2f}x / {f2(ce, 0)}")
                    else:
                        row.append("–")
                rows.append(row)
            md.append(table(["system"] + [f"{a} {b} qd{c}" for a, b, c in jobs], rows))
        if "fio.png" in written:
            md.append("![fio](fio.png)\n")

    sam = [s for s in res["samtools"] if "seconds" in s]
    if sam:
        base = next((s["seconds"] for s in sam if s["system"] == "densefs-off"), None)
        bare = next((s["seconds"] for s in sam if s["system"] == "bare"), None)
        md.append("## 5. An application competing for the CPU: `samtools sort -@2` (the seeds' bwa/samtools "
                  "table)\n")
        md.append(f"Input SAM ({sam[0]['bytes'] / 1e6:.0f} MB) read cold from the system; temporaries and the "
                  "BAM written to it; fsync + sync included; the best of the runs listed.\n")
        rows = [[r.name(s["system"]), f2(s["seconds"]), f2(s["seconds"] / base if base else None),
                 f2(s["seconds"] / bare if bare else None), f2(s["cpu_busy_s"], 1), f2(s["fs_cpu_s"], 1),
                 run_list(s.get("all_s", []), s.get("all_steal_s", []))]
                for s in sam]
        md.append(table(["system", "s", "vs densefs off", "vs bare", "CPU s", "FS cpu s", "runs s"], rows))
        if "samtools.png" in written:
            md.append("![samtools](samtools.png)\n")

    if sids:
        md.append(f"## 6. Cost-efficiency (QZFS): throughput × ratio / CPU utilisation ({n} cores, FASTQ)\n")
        rows = []
        for s in sids:
            c = r.copy[(s, n, "fastq")]
            rows.append([r.name(s), f2(c["ratio"]), f2(c["copy"]["mb_s"], 0), f"{c['copy']['cpu_util'] * 100:.0f}%",
                         f2(cost_eff(c["copy"]["mb_s"], c["ratio"], c["copy"]["cpu_util"]), 0),
                         f2(c["read"]["mb_s"], 0), f"{c['read']['cpu_util'] * 100:.0f}%",
                         f2(cost_eff(c["read"]["mb_s"], c["ratio"], c["read"]["cpu_util"]), 0)])
        md.append(table(["system", "ratio", "copy MB/s", "copy CPU util", "copy cost-eff.", "read MB/s",
                         "read CPU util", "read cost-eff."], rows))
        if "cost.png" in written:
            md.append("![cost](cost.png)\n")
    workloads_md(md, r, res)
    noisy = []
    for c in res["copy"]:
        for what in ("copy", "read"):
            k = c.get(what) or {}
            if k.get("foreign_cpu_s", 0) > 0.1 * k.get("seconds", 0) * c["cores"] and k.get("foreign_cpu_s", 0) > 0.05:
                noisy.append([r.name(c["system"]), c["cores"], c["data"], what, f2(k["seconds"]),
                              f2(k["foreign_cpu_s"]), ", ".join(k.get("top", []))])
    for k in WORKLOADS:
        for x in res.get(k, []):
            for what, step in ((w, x[w]) for w in ("untar", "ls", "cat", "rm", "read") if isinstance(x.get(w), dict)) \
                    if k != "fsync" else [("fio", x)]:
                if step.get("foreign_cpu_s", 0) > 0.1 * step.get("seconds", 0) * x["cores"] and \
                        step.get("foreign_cpu_s", 0) > 0.05:
                    noisy.append([r.name(x["system"]), x["cores"], k, what, f2(step["seconds"]),
                                  f2(step["foreign_cpu_s"]), ", ".join(step.get("top", []))])
    if noisy:
        md.append("## Interference\n")
        md.append("Kept measurements during which other users' processes (not the harness, its clients or the file "
                  "system under test) used more than 10% of the cores in use; `top` names the busiest processes "
                  "of the interval. Treat these rows with care.\n")
        md.append(table(["system", "cores", "data", "what", "s", "foreign CPU s", "top"], noisy))
    if why:
        md.append(f"_{why}_\n")
    (out / "report.md").write_text("\n".join(md))



def workloads_md(md, r, res):
    """7 smallfiles, 8 bigread, 9 fsync (bench/workloads.py): a table per workload, then densefs / btrfs."""
    m = res["meta"]
    most = max((x["cores"] for x in res.get("smallfiles", [])), default=None)
    sf = {x["system"]: x for x in res.get("smallfiles", []) if "untar" in x and x["cores"] == most}
    sf1 = {x["system"]: x for x in res.get("smallfiles", []) if "untar" in x and x["cores"] == 1 and most > 1}
    br = {x["system"]: x for x in res.get("bigread", []) if "read" in x}
    fs = {x["system"]: x for x in res.get("fsync", []) if "iops" in x}
    bd = {x["system"]: x for x in res.get("bigdir", []) if "create" in x}
    if not (sf or br or fs or bd):
        return
    steps = [("untar", "untar + sync"), ("stat", "lstat every file warm"), ("walk", "du + find warm"),
             ("ls", "ls -lR cold"), ("cat", "cat every file cold"), ("rm", "rm -rf + sync"),
             ("untar_cold", "untar + sync, tar cold")]
    # Runs from before a step existed (the warm lstat came with issue 13's long attribute timeouts,
    # the warm walk with the kernel's directory cache).
    steps = [(k, t) for k, t in steps if all(k in x for x in [*sf.values(), *sf1.values()])]

    def vs(d, b, get, time):
        """densefs over btrfs, higher is better: btrfs time / densefs time, or densefs rate / btrfs rate."""
        x, y = get(d), get(b)
        if not x or not y:
            return None
        return y / x if time else x / y

    def ratio_of(sid, table, get, time):
        p = next(((d, b) for d, b in pairs(r.sys) if d == sid), None)
        if not p or p[0] not in table or p[1] not in table:
            return "–"
        return f"{vs(p[0], p[1], get, time):.2f}× vs {r.name(p[1])}"

    def seconds_of(tab, k):
        """A system's median seconds for step `k` of a step table (None where it did not run)."""
        return lambda s: tab[s][k]["seconds"] if s in tab else None

    def step_cells(s, tab, stps):
        """A system's median seconds per step, densefs ÷ btrfs per step, and every run's seconds."""
        x = tab[s]
        ratio = [ratio_of(s, tab, seconds_of(tab, k), True) for k, _ in stps]
        return ([f2(x[k]["seconds"]) for k, _ in stps],
                " / ".join(c.split("×")[0] for c in ratio) if ratio[0] != "–" else "–",
                " / ".join(run_list(x[k]["all_s"], x[k].get("all_steal_s", [])) for k, _ in stps))

    def smallfiles_table(tab):
        rows = []
        for s in [s for s in r.order if s in tab]:
            x = tab[s]
            secs, ratio, runs = step_cells(s, tab, steps)
            rows.append([r.name(s)] + secs +
                        [f2(x["cat"].get("mb_s"), 0), f2(x["untar"]["cpu_busy_s"], 1), f2(x["untar"]["fs_cpu_s"], 1),
                         ratio, "yes" if x.get("verified") else ("DIFFERS" if "verified" in x else "–"), runs])
        md.append(table(["system"] + [f"{t} s" for _, t in steps] +
                        ["cat MB/s", "untar CPU s", "untar FS cpu s",
                         f"densefs ÷ btrfs ({' / '.join(k for k, _ in steps)}), higher is better", "checked",
                         "runs s"], rows))

    def get_mb(s):
        return br[s]["read"]["mb_s"] if s in br else None

    def get_iops(s):
        return fs[s]["iops"] if s in fs else None

    prs = [(d, b) for d, b in pairs(r.sys) if (d in sf and b in sf) or (d in br and b in br) or (d in fs and b in fs)]
    if prs:
        md.append("## densefs vs btrfs at the same algorithm: small files, large cold read, fsync'd 4K writes\n")
        md.append("Each cell is densefs's speed over btrfs's (**higher is better**, above 1 densefs is faster): btrfs "
                  "seconds / densefs seconds for the small-file steps, densefs MB/s / btrfs MB/s for the cold read, "
                  "densefs IOPS / btrfs IOPS for the fsync'd writes. Sections 7 to 9 have the numbers.\n")
        rows = []
        for d, b in prs:
            row = [f"{r.name(d)} / {r.name(b)}"]
            row += [f2(vs(d, b, seconds_of(sf, k), True)) for k, _ in steps]
            row += [f2(vs(d, b, get_mb, False)), f2(vs(d, b, get_iops, False))]
            rows.append(row)
        # A reference for any FUSE file system on this machine: bindfs passes each request straight to
        # the lower directory and compresses nothing, so its small-file ratios (bindfs ÷ the same btrfs)
        # show what the kernel's round trips per file leave.
        if "bindfs" in sf:
            for b in dict.fromkeys(b for _, b in prs if b in sf):
                rows.append([f"bindfs (plain FUSE, no compression) / {r.name(b)}"] +
                            [f2(vs("bindfs", b, seconds_of(sf, k), True)) for k, _ in steps] + ["–", "–"])
        # The same on one core (section 7b): the file systems' own work, without cross-core wake-ups.
        for d, b in ((d, b) for d, b in pairs(r.sys) if d in sf1 and b in sf1):
            rows.append([f"{r.name(d)} / {r.name(b)}, 1 core"] +
                        [f2(vs(d, b, seconds_of(sf1, k), True)) for k, _ in steps] + ["–", "–"])
        if "bindfs" in sf1:
            for b in dict.fromkeys(b for _, b in prs if b in sf1):
                rows.append([f"bindfs / {r.name(b)}, 1 core"] +
                            [f2(vs("bindfs", b, seconds_of(sf1, k), True)) for k, _ in steps] + ["–", "–"])
        md.append(table(["densefs / btrfs"] + [t for _, t in steps] + ["large cold read MB/s", "fsync 4K IOPS"], rows))
        if "bindfs" in sf:
            md.append("The bindfs rows are a reference, not a densefs setting: a FUSE passthrough that compresses "
                      "nothing pays the same kernel round trips per file as densefs (LOOKUP, CREATE, SETATTR, "
                      "GETXATTR, FLUSH, RELEASE...), so the small-file steps of any FUSE file system here land near "
                      "these ratios.\n")

    if sf:
        t = m.get("tree", {})
        x = next(iter(sf.values()))
        md.append("## 7. Small files: untar, ls -lR, cat, rm -rf of a tree\n")
        md.append(f"The tree: a tar of /{', /'.join(t.get('dirs_in_tar', []))} made once on this machine "
                  f"(`{t.get('file', '?')}`): {t.get('files', 0)} files, {t.get('dirs', 0)} directories, "
                  f"{t.get('symlinks', 0)} symlinks, {t.get('bytes', 0) / 1e6:.0f} MB in files. Per system, "
                  f"{x.get('runs', 1)} time(s): `tar xf TREE -C DIR` (TREE read from the page cache) then `sync`; "
                  + ("2 s later, `lstat` of every file by its path (what make or git status does; names and "
                     "attributes seen before) warm; " if any(k == "stat" for k, _ in steps) else "") +
                  ("`du -s DIR` then `find DIR -newer LIST` warm (what backup, build and search tools do: "
                   "every directory read, every entry stat'd); " if any(k == "walk" for k, _ in steps) else "") +
                  "`ls -lR DIR > /dev/null` cold; "
                  "`find DIR -type f -print0 | xargs -0 cat > /dev/null` cold; `rm -rf DIR` then `sync`" +
                  ("; after the rounds, once more the untar + sync with TREE dropped from the page cache first "
                   "(*tar cold*)" if any(k == "untar_cold" for k, _ in steps) else "") +
                  ". Cold: the "
                  "daemon's own caches dropped (densefs and bindfs remounted, the zfs-fuse pool exported and "
                  "imported), then `drop_caches`. densefs lands every file in the lower directory when it is closed, "
                  "so `sync` covers it as it does btrfs. Seconds are the median run (**lower is better**); `runs` "
                  f"lists every run of each step in the order {' / '.join(k for k, _ in steps)}. `checked`: the tree read back "
                  "after a cold remount equals the tar (`tar --diff`: contents, modes, owners, times, links).\n")
        smallfiles_table(sf)
        if sf1:
            md.append("### 7b. The same on 1 core\n")
            md.append("Everything pinned to one core (tar, ls, cat, rm, the daemons, btrfs's kernel workqueues), so "
                      "that a FUSE request is a context switch on that core instead of a wake-up of the other one. "
                      "On this machine a wake-up of an idle core costs more than the request's own work (see the "
                      "idle cores above); 7b shows what each file system's own work per file costs.\n")
            smallfiles_table(sf1)
        bad = [(s, x) for tab in (sf, sf1) for s, x in tab.items() if x.get("verified") is False]
        for s, x in bad:
            kinds = x.get("verify_kinds")
            if kinds:
                what = ", ".join(f"{n} × `{k}`" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
            else:  # older results: the first lines only
                what = "; ".join(f"`{line}`" for line in x.get("verify_diff", []))[:500] + " (the first lines)"
            md.append(f"**{r.name(s)}: the tree read back differs from the tar** (`tar --diff`): " +
                      what.replace("|", "/") + "\n")

    if br:
        x = next(iter(br.values()))
        md.append(f"## 8. Large cold sequential read: `cat` of a {x['bytes'] / 1e6:.0f} MB FASTQ\n")
        md.append("The FASTQ copied in (`cp` from page cache, fsync + sync, timed too), then read "
                  f"{x.get('runs', 1)} time(s) cold (the daemon's caches and the page cache dropped), "
                  "`cat FILE > /dev/null`; the median read is shown (**MB/s: higher is better**).\n")
        rows = []
        for s in [s for s in r.order if s in br]:
            x = br[s]
            rows.append([r.name(s), f2(x.get("ratio")), f2(x["copy"]["seconds"]), f2(x["copy"]["mb_s"], 0),
                         f2(x["read"]["seconds"]), f2(x["read"]["mb_s"], 0), ratio_of(s, br, get_mb, False),
                         f2(x["read"]["cpu_busy_s"], 1), f2(x["read"]["fs_cpu_s"], 1),
                         run_list(x["read"].get("all_s", []), x["read"].get("all_steal_s", []))])
        md.append(table(["system", "ratio", "copy s", "copy MB/s", "cold read s", "cold read MB/s",
                         "densefs ÷ btrfs (MB/s), higher is better", "read CPU s", "read FS cpu s", "read runs s"], rows))

    if fs:
        x = next(iter(fs.values()))
        md.append("## 9. fsync'd 4K random writes (fio)\n")
        md.append(f"`fio --rw=randwrite --bs=4k --fsync=1 --ioengine=psync --size={x['size']} "
                  f"--runtime={x['runtime_s']} --time_based` on a file laid out first (1 MiB writes, fsync'd), "
                  "fio's default (incompressible) buffers; every write is followed by an fsync. "
                  "**IOPS: higher is better**; latencies are means.\n")
        rows = []
        for s in [s for s in r.order if s in fs]:
            x = fs[s]
            rows.append([r.name(s), f2(x["iops"], 0), f2(x["mb_s"], 1), f2(x.get("write_lat_us"), 0),
                         f2(x.get("fsync_lat_us"), 0), ratio_of(s, fs, get_iops, False),
                         f"{x['cpu_util'] * 100:.0f}%", f2(x.get("fs_cpu_s"), 1)])
        md.append(table(["system", "IOPS", "MB/s", "write µs", "fsync µs", "densefs ÷ btrfs (IOPS), higher is better",
                         "CPU util", "FS cpu s"], rows))

    if bd:
        x = next(iter(bd.values()))
        dsteps = [("create", "create + sync"), ("ls_f", "ls -f cold"), ("ls_l", "ls -l cold"), ("rm", "rm -rf + sync")]
        md.append(f"## 10. One directory of {x['files']} small files\n")
        md.append(f"One process creates {x['files']} files of 16 bytes in one directory (`open`, `write`, `close` "
                  "each), then `sync`; `ls -f DIR` cold lists the names only (READDIR through FUSE); `ls -l DIR` "
                  "cold asks every entry's attributes (READDIRPLUS); `rm -rf DIR` then `sync`. Cold as in "
                  f"section 7. Seconds are the median of {x.get('runs', 1)} run(s) (**lower is better**); `listed`: "
                  "both listings showed every file.\n")
        rows = []
        for s in [s for s in r.order if s in bd]:
            secs, ratio, runs = step_cells(s, bd, dsteps)
            rows.append([r.name(s)] + secs + [ratio, "yes" if bd[s].get("listed_all") else "NO", runs])
        md.append(table(["system"] + [f"{t} s" for _, t in dsteps] +
                        ["densefs ÷ btrfs (create / ls -f / ls -l / rm), higher is better", "listed", "runs s"], rows))


if __name__ == "__main__":
    src = Path(sys.argv[1])
    make(json.loads(src.read_text()), Path(sys.argv[2]) if len(sys.argv) > 2 else src.parent)
