"""Issue 13's workloads, run by harness.py beside the same peers (its systems, setup/teardown, cold()):
  7 smallfiles  a tree of many small files (a tar of /usr/include + /usr/share/doc; --quick:
                /usr/include/linux): untar + sync, lstat of every file warm (2 s later, as make or
                git status does), `du -s` + `find -newer` warm, ls -lR cold, cat every file cold,
                rm -rf + sync;
                the median of --reps, the tree checked once against the tar (`tar --diff`) after a cold remount
  8 bigread     a --big-size MiB FASTQ copied in (fsync + sync), then `cat FILE > /dev/null` cold;
                the median MB/s of --reps
  9 fsync       fio randwrite bs=4k fsync=1 ioengine=psync on a 64 MiB file (laid out first), time-based;
                IOPS
 10 bigdir      one directory of --bigdir-files small files (16 bytes each; --quick: 2,000): create + sync,
                `ls -f` cold (names only), `ls -l` cold (attributes), rm -rf + sync; the median of --reps
Each step is timed with the harness's Meter (CPU of the cores in use and of the daemon). The harness is
handed over by bind() (it runs as __main__; importing it here would load a second copy).
"""
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

h = None  # the harness module (bind)

EXPERIMENTS = ("smallfiles", "bigread", "fsync", "bigdir")
# Run on one core too. A FUSE request is a hand-off from the client to a daemon thread and back;
# when the two sit on different cores each hand-off wakes an idle core, which costs far more in a
# VM whose host turned guest halt polling off (haltpoll.guest_halt_poll_ns=0) than the request
# itself. On one core the hand-offs are plain context switches: that shows what the file
# system's own work per file costs.
ONE_CORE = ("smallfiles",)
TREE = ["usr/include", "usr/share/doc"]
TREE_QUICK = ["usr/include/linux"]
# By default these run on one system per family and algorithm that btrfs has too (lz4 ~ lzo, zstd-3).
# densefs-lz4-devfuse: the same with requests through /dev/fuse instead of io_uring's per-CPU queues.
SYSTEMS = ("bare", "bindfs", "densefs-lz4", "densefs-lz4-devfuse", "densefs-zstd-3", "btrfs-lzo", "btrfs-zstd3")


def bind(harness):
    global h
    h = harness


def median_run(runs):
    """The run with the median time (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]


def medians(steps):
    """Each step's median run, with every run's seconds (`all_s`) and steal (`all_steal_s`)."""
    return {k: dict(median_run(v), all_s=[r["seconds"] for r in v], all_steal_s=h.steals(v)) for k, v in steps.items()}


# ----------------------------------------------------------------------------- data

def tree_tar(data, quick):
    """A tar of /usr/include + /usr/share/doc (quick: /usr/include/linux), made once into the data cache
    (so every system and every later run gets the same tree, whatever apt installs meanwhile)."""
    dst = data / ("tree-quick.tar" if quick else "tree.tar")
    if not dst.exists():
        dirs = [d for d in (TREE_QUICK if quick else TREE) if Path("/", d).is_dir()]
        if not dirs:
            raise h.Skip(f"none of /{', /'.join(TREE_QUICK if quick else TREE)} here")
        h.log(f"tar cf {dst.name} -C / {' '.join(dirs)}")
        tmp = Path(f"{dst}.tmp{os.getpid()}")
        p = h.run(["tar", "cf", str(tmp), "-C", "/", *dirs], check=False, timeout=1800)
        if p.returncode not in (0, 1):  # 1: a file changed while read (still a valid archive)
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"tar cf {dst}: {p.stdout[-300:]}")
        os.replace(tmp, dst)
    return dst


def tree_info(tar):
    """Counts and bytes of the tree, from the tar's headers."""
    n = {"files": 0, "dirs": 0, "symlinks": 0, "other": 0, "bytes": 0}
    with tarfile.open(tar) as t:
        for m in t:
            k = "files" if m.isreg() else "dirs" if m.isdir() else "symlinks" if m.issym() else "other"
            n[k] += 1
            if m.isreg():
                n["bytes"] += m.size
    n["file"], n["tar_bytes"], n["dirs_in_tar"] = tar.name, tar.stat().st_size, TREE_QUICK if "quick" in tar.name else TREE
    return n


def prepare(data, args):
    """The workloads' data: the tree's tar and the big FASTQ, as selected."""
    d = {}
    if "smallfiles" in args.experiments:
        d["tree"] = tree_tar(data, args.quick)
    if "bigread" in args.experiments:
        d["big"] = h.sized_copy(h.source_fastq(data), data / f"reads-{args.big_size}M.fastq", args.big_size * h.MiB, 4)
    return d


# ----------------------------------------------------------------------------- experiments

def timed(system, cpus, cold, fn):
    """One step in a Meter; after cold() and drop_caches when `cold` (the daemon's pid changes then)."""
    if cold:
        system.cold()
        h.drop_caches()
    else:
        os.sync()  # others' dirty data is not ours to time
    with h.Meter(cpus, system.pids()) as r:
        fn()
    return r


def exp_smallfiles(system, tar, info, cpus, reps):
    """7: untar + sync, lstat of every file warm, du + find warm, ls -lR cold, cat every file cold, rm -rf
    + sync; `reps` times, the medians kept; then once an untar + sync of the tar read from the disk. After
    the first untar the tree is compared with the tar (contents, modes, owners, times, links)."""
    d = system.path / "tree"
    steps = {"untar": [], "stat": [], "walk": [], "ls": [], "cat": [], "rm": [], "untar_cold": []}
    check = {}
    listing = system.path.parent / "tree-files.txt"  # outside the file system under test

    def sync():
        system.sync()  # btrfs/bare: sync; densefs/bindfs: every close already landed the file; zfs: txg

    def untar():
        h.run(["tar", "xf", str(tar), "-C", str(d)], timeout=None)
        sync()

    def cat():
        h.run(["bash", "-c", 'set -o pipefail; find "$1" -type f -print0 | xargs -0 cat > /dev/null', "-",
               str(d)], timeout=None)

    def rm():
        h.run(["rm", "-rf", str(d)], timeout=None)
        sync()

    def stat_all():
        # What make or git status does: lstat every file by its path, names and attributes seen
        # before (a kernel that keeps them for less than the 2 s since asks the file system again).
        h.run(["python3", "-c", "import os, sys\nfor p in open(sys.argv[1]).read().split('\\0')[:-1]: os.lstat(p)",
               str(listing)], timeout=None)

    def walk():
        # What backup, build and search tools do: read every directory and stat every entry
        # (listings, names and attributes seen before).
        h.run(["du", "-s", str(d)], stdout=subprocess.DEVNULL, timeout=None)
        h.run(["find", str(d), "-newer", str(listing)], stdout=subprocess.DEVNULL, timeout=None)

    try:
        for i in range(reps):
            d.mkdir()
            # Every round reads the tar from the page cache: the cold steps of the round before
            # dropped it, and a tar read from the disk is another workload (`untar_cold` below;
            # docs/PERFORMANCE.md, "Ring threads that look before they sleep").
            h.warm(tar)
            steps["untar"].append(timed(system, cpus, False, untar))
            with open(listing, "w") as f:
                f.writelines(os.path.join(top, n) + "\0" for top, _, names in os.walk(d) for n in names)
            time.sleep(2)
            steps["stat"].append(timed(system, cpus, False, stat_all))
            steps["walk"].append(timed(system, cpus, False, walk))
            steps["ls"].append(timed(system, cpus, True, lambda: h.run(["ls", "-lR", str(d)], stdout=subprocess.DEVNULL,
                                                                      timeout=None)))
            steps["cat"].append(timed(system, cpus, True, cat))
            steps["cat"][-1]["mb_s"] = info["bytes"] / 1e6 / steps["cat"][-1]["seconds"]
            if i == 0:  # once: the tree read back from the disk (a cold remount) against the tar
                system.cold()
                h.drop_caches()
                p = h.run(["tar", "--diff", "-f", str(tar), "-C", str(d)], check=False, timeout=None)
                lines = p.stdout.strip().splitlines() if p.returncode else []
                kinds = {}
                for line in lines:  # "PATH: Mod time differs" -> {"Mod time differs": count}
                    k = line.rsplit(": ", 1)[-1]
                    kinds[k] = kinds.get(k, 0) + 1
                check = {"verified": p.returncode == 0, "verify_diff": lines[:10], "verify_kinds": kinds}
            steps["rm"].append(timed(system, cpus, False, rm))
        # Once more with the tar read from the disk, as a tarball just downloaded or copied is.
        d.mkdir()
        h.drop_caches()
        steps["untar_cold"].append(timed(system, cpus, False, untar))
        rm()
        rec = medians(steps)
        rec.update(check, runs=reps)
        u, st, wk, ls, c, r = (rec[k]["seconds"] for k in ("untar", "stat", "walk", "ls", "cat", "rm"))
        h.log(f"{system.name:18} smallfiles x{reps}: untar {u:6.2f}s stat {st:5.2f}s walk {wk:5.2f}s ls -lR {ls:5.2f}s "
              f"cat {c:6.2f}s "
              f"rm {r:5.2f}s untar, tar cold {rec['untar_cold']['seconds']:6.2f}s "
              f"{'verified' if rec.get('verified') else 'DIFFERS: ' + ' / '.join(rec.get('verify_diff', []))[:200]}")
    except Exception as e:
        rec = {"error": str(e)}
        h.log(f"{system.name}: smallfiles: {e}")
    h.run(["rm", "-rf", str(d)], check=False, timeout=None)
    return rec


def exp_bigread(system, src, cpus, reps, verify):
    """8: the big FASTQ copied in (cp from page cache, fsync + sync: timed too), then cold `cat`
    (the daemon's caches dropped by cold(), then drop_caches), `reps` times, the median kept."""
    dst = system.path / src.name
    rec = {"bytes": src.stat().st_size}
    try:
        rec["copy"] = h.exp_copy(system, src, dst, cpus)
        rec.update(system.ratio(dst))
        reads = [h.exp_read(system, src, dst, cpus, verify and i == 0) for i in range(reps)]
        rec.update(read=dict(median_run(reads), all_s=[r["seconds"] for r in reads], all_steal_s=h.steals(reads)),
                   runs=reps)
        if verify:
            rec["verified"] = reads[0].get("verified", False)
        h.log(f"{system.name:18} bigread {rec['bytes'] / h.MiB:.0f} MiB x{reps}: copy {rec['copy']['seconds']:6.2f}s "
              f"ratio {rec['ratio']:.2f} cold cat {rec['read']['seconds']:5.2f}s = {rec['read']['mb_s']:5.0f} MB/s")
    except Exception as e:
        rec["error"] = str(e)
        h.log(f"{system.name}: bigread: {e}")
    dst.unlink(missing_ok=True)
    return rec


def exp_fsync(system, cpus, size, runtime):
    """9: 4 KiB random writes, each followed by an fsync (fio randwrite bs=4k fsync=1 psync), on a file
    laid out first (sequential 1 MiB writes, fsync'd; fio's default, incompressible buffers)."""
    d = system.path / "fsync"
    d.mkdir(exist_ok=True)
    f = d / "fsync.dat"
    rec = {"size": size, "runtime_s": runtime}
    try:
        h.run(["fio", "--name=layout", f"--filename={f}", f"--size={size}", "--rw=write", "--bs=1M",
               "--ioengine=psync", "--fallocate=none", "--end_fsync=1"], timeout=900)
        cmd = ["fio", "--output-format=json", "--name=fsync", f"--filename={f}", f"--size={size}", "--rw=randwrite",
               "--bs=4k", "--fsync=1", "--ioengine=psync", "--fallocate=none", "--overwrite=1", "--time_based=1",
               f"--runtime={runtime}"]
        res = {}

        def job():
            p = h.run(cmd, check=False, stderr=subprocess.PIPE, timeout=None)
            if p.returncode:
                raise RuntimeError(f"fio fsync: {(p.stderr or p.stdout)[-300:]}")
            res["j"] = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
        rec.update(timed(system, cpus, False, job))
        w, s = res["j"]["write"], res["j"].get("sync", {})
        rec.update(iops=w["iops"], mb_s=w["bw_bytes"] / 1e6, ios=w["total_ios"],
                   write_lat_us=w["lat_ns"]["mean"] / 1e3,
                   fsync_lat_us=(s.get("lat_ns") or {}).get("mean", 0) / 1e3 or None,
                   fsync_p99_us=((s.get("lat_ns") or {}).get("percentile") or {}).get("99.000000", 0) / 1e3 or None)
        h.log(f"{system.name:18} fsync 4k randwrite: {rec['iops']:7.0f} IOPS, write {rec['write_lat_us']:.0f} us, "
              f"fsync {rec['fsync_lat_us'] or 0:.0f} us")
    except Exception as e:
        rec["error"] = str(e)
        h.log(f"{system.name}: fsync: {e}")
    f.unlink(missing_ok=True)
    return rec


def exp_bigdir(system, cpus, files, reps):
    """10: one directory of `files` small files: create + sync, `ls -f` cold (READDIR: names only),
    `ls -l` cold (READDIRPLUS: attributes too), rm -rf + sync; `reps` times, the medians kept."""
    d = system.path / "bigdir"
    steps = {"create": [], "ls_f": [], "ls_l": [], "rm": []}
    listed = {}

    def create():
        # One process writes them all, as a program saving its outputs would (no fork per file).
        h.run(["python3", "-c", "import os, sys\n"
               "for i in range(int(sys.argv[2])):\n"
               "    fd = os.open(f'{sys.argv[1]}/f{i:08d}', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)\n"
               "    os.write(fd, b'%015d\\n' % i)\n"
               "    os.close(fd)\n", str(d), str(files)], timeout=None)
        system.sync()

    def ls(flag):
        def go():
            p = h.run(["bash", "-c", 'set -o pipefail; ls "$1" "$2" | wc -l', "-", flag, str(d)], timeout=None)
            listed[flag] = int(p.stdout.split()[-1])
        return go

    def rm():
        h.run(["rm", "-rf", str(d)], timeout=None)
        system.sync()

    try:
        for _ in range(reps):
            d.mkdir()
            steps["create"].append(timed(system, cpus, False, create))
            steps["ls_f"].append(timed(system, cpus, True, ls("-f")))
            steps["ls_l"].append(timed(system, cpus, True, ls("-l")))
            steps["rm"].append(timed(system, cpus, False, rm))
        # ls -f lists . and .. too; ls -l starts with a "total" line.
        rec = medians(steps)
        rec.update(files=files, runs=reps, listed_all=listed.get("-f") == files + 2 and listed.get("-l") == files + 1)
        c, f, l, r = (rec[k]["seconds"] for k in ("create", "ls_f", "ls_l", "rm"))
        h.log(f"{system.name:18} bigdir {files} x{reps}: create {c:6.2f}s ls -f {f:5.2f}s ls -l {l:6.2f}s "
              f"rm {r:5.2f}s {'all listed' if rec['listed_all'] else 'LISTED ' + str(listed)}")
    except Exception as e:
        rec = {"error": str(e)}
        h.log(f"{system.name}: bigdir: {e}")
    h.run(["rm", "-rf", str(d)], check=False, timeout=None)
    return rec


def run_all(env, system, data, cpus, args, names):
    """Workloads `names` on one system (set up by the harness), into env.results."""
    for name in names:
        if name == "smallfiles":
            r = exp_smallfiles(system, data["tree"], env.results["meta"]["tree"], cpus, args.reps)
        elif name == "bigread":
            r = exp_bigread(system, data["big"], cpus, args.reps, args.verify)
        elif name == "bigdir":
            r = exp_bigdir(system, cpus, args.bigdir_files, args.reps)
        else:
            r = exp_fsync(system, cpus, env.fsync_size, env.fsync_runtime)
        r.update(system=system.id, cores=len(cpus), experiment=name)
        env.results[name].append(r)
