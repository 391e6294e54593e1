#!/usr/bin/env python3
"""densefs benchmark harness: the seeds' experiments, densefs beside real peers, in one run.

Systems: densefs at several algorithms, btrfs (loop device, compress-force), zfs-fuse datasets,
bindfs (FUSE passthrough) and the bare lower directory. Experiments (numbered as in the issue):
  1 copy   cp a FASTQ from page cache into each system, fsync + sync included
  2 read   drop caches (and the daemons' own caches), cat FILE > /dev/null
  3 cores  1 and 2 alike, with the whole run pinned to 1 core vs all cores
  4 fio    NoLoad's grid: write/randwrite/read/randread x bs x iodepth, 90%-compressible buffers
  5 app    samtools sort -@2 of a SAM on each system (slowdown vs densefs off)
  6 cost   QZFS's cost-efficiency: throughput x compression ratio / CPU utilisation
  7 smallfiles  untar, ls -lR cold, cat every file cold, rm -rf of a tree of small files; on all  } workloads.py
               cores, then on 1 core                                                              }
  8 bigread     a large FASTQ read cold (MB/s)                                                   }
  9 fsync       fio 4K random writes, each fsync'd (IOPS)                                        }
 10 bigdir      create, ls -f, ls -l, rm -rf of one directory of 200,000 small files             }
--experiments picks some (default: all). Everything is written to results.json; report.py turns it into report.md and PNG plots.
Every mount, loop device, zpool and daemon made here is undone on exit, failure or signal.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
import report  # noqa: E402
import workloads  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class Skip(Exception):
    """A system or experiment that cannot run here; the message is the reason shown in the report."""


def run(cmd, check=True, timeout=600, quiet=True, text=True, **kw):
    """Run a command; on failure raise with its output tail (never a silent failure)."""
    kw.setdefault("stdout", subprocess.PIPE if quiet else None)
    kw.setdefault("stderr", subprocess.STDOUT if quiet else None)
    p = subprocess.run(cmd, timeout=timeout, text=text, **kw)
    if check and p.returncode != 0:
        out = (p.stdout or "").strip()[-600:] if isinstance(p.stdout, str) else ""
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}: {out}")
    return p


def out(cmd, **kw):
    return run(cmd, **kw).stdout


# ----------------------------------------------------------------------------- cleanup

class Cleanup:
    """A stack of undo actions; each system pops its own, the rest run at exit, newest first."""

    def __init__(self):
        self.stack = []

    def push(self, what, fn):
        self.stack.append((what, fn))
        return (what, fn)

    def pop(self, token):
        """Run one undo action now (and forget it)."""
        if token in self.stack:
            self.stack.remove(token)
            self._do(*token)

    def all(self):
        while self.stack:
            self._do(*self.stack.pop())

    @staticmethod
    def _do(what, fn):
        try:
            fn()
        except Exception as e:  # keep undoing the rest
            log(f"cleanup: {what}: {e}")


CLEAN = Cleanup()


def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def unmount(path):
    for _ in range(20):
        if not mounted(path):
            return
        if run(["umount", path], check=False).returncode == 0:
            return
        time.sleep(0.5)
    run(["umount", "-l", path], check=False)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def pid_cmd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_pid(pid, grace=30):
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(grace * 10):
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# ----------------------------------------------------------------------------- CPU accounting

def cpu_ticks(cpus):
    """Sum of /proc/stat's per-CPU lines over `cpus`: user nice system idle iowait irq softirq steal."""
    tot = [0] * 8
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                parts = line.split()
                if int(parts[0][3:]) in cpus:
                    for i in range(8):
                        tot[i] += int(parts[1 + i])
    return tot


def proc_ticks(pid):
    """utime + stime of a process (all its threads), like /proc/PID/stat fields 14 and 15."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def all_ticks():
    """{(pid, name): utime + stime} of every process, to name what else ran during a measurement."""
    t = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    s = f.read()
                rest = s.rsplit(")", 1)[1].split()
                kthread = int(rest[6]) & 0x00200000  # PF_KTHREAD
                t[(int(d), s[s.index("(") + 1:s.rindex(")")])] = (int(rest[11]) + int(rest[12]), kthread)
            except (OSError, ValueError, IndexError):
                pass
    return t


class Meter:
    """Wall time, CPU of the allowed cores (as dstat does) and of the file system's own process; the
    busiest processes of the interval (`top`) show what else competed for the CPU."""

    def __init__(self, cpus, pids=()):
        self.cpus, self.pids, self.r = cpus, list(pids), {}

    def __enter__(self):
        self.a0 = all_ticks()
        self.p0 = {p: proc_ticks(p) for p in self.pids}
        self.s0 = cpu_ticks(self.cpus)
        self.t0 = time.perf_counter()
        return self.r

    def __exit__(self, *exc):
        t = time.perf_counter() - self.t0
        s1 = cpu_ticks(self.cpus)
        d = [b - a for a, b in zip(self.s0, s1)]
        user, nice, system, idle, iowait, irq, softirq, steal = d
        busy = user + nice + system + irq + softirq
        total = max(1, busy + idle + iowait + steal)
        try:
            fs = sum(proc_ticks(p) - t0 for p, t0 in self.p0.items()) / CLK if self.pids else None
        except OSError:
            fs = None
        a1 = all_ticks()
        used = sorted(((a1[k][0] - v[0], k, v[1]) for k, v in self.a0.items() if k in a1 and a1[k][0] > v[0]),
                      reverse=True)
        self.r["top"] = [f"{name}[{pid}] {t / CLK:.2f}s" for t, (pid, name), _ in used[:3]]
        # user processes that are neither the harness, its clients (cp, cat: gone by now) nor the file system
        ours = set(self.pids) | {os.getpid()}
        self.r["foreign_cpu_s"] = sum(t for t, (pid, _), kt in used if not kt and pid not in ours) / CLK
        self.r.update(seconds=t, cpu_user_s=(user + nice) / CLK, cpu_sys_s=(system + irq + softirq) / CLK,
                      cpu_iowait_s=iowait / CLK, cpu_busy_s=busy / CLK, cpu_util=busy / total, fs_cpu_s=fs,
                      cpu_steal_s=steal / CLK)
        return False


# ----------------------------------------------------------------------------- packages

def installed(pkg):
    p = run(["dpkg-query", "-W", "-f=${Status}", pkg], check=False)
    return p.returncode == 0 and "install ok installed" in p.stdout


_apt_updated = False


def ensure_packages(pkgs):
    """apt-get install what is missing; returns {package: None if present, else the reason}."""
    global _apt_updated
    missing = [p for p in pkgs if not installed(p)]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if missing:
        log(f"apt-get install {' '.join(missing)}")
        for attempt in range(2):
            if run(["apt-get", "install", "-y", "-q", *missing], check=False, env=env, timeout=1200).returncode == 0:
                break
            if not _apt_updated:
                run(["apt-get", "update", "-q"], check=False, env=env, timeout=600)
                _apt_updated = True
            else:  # one by one, so one broken package does not take the others down
                for p in missing:
                    run(["apt-get", "install", "-y", "-q", p], check=False, env=env, timeout=1200)
                break
    return {p: None if installed(p) else f"apt-get install {p} failed" for p in pkgs}


# ----------------------------------------------------------------------------- data

DEB = "drop-seq-testdata"


def atomic_write(path, writer):
    tmp = Path(f"{path}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            writer(f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def drop_seq_bams(data):
    """Debian's drop-seq-testdata ships real Illumina BAMs (gzipped): apt-get download, dpkg -x."""
    x = data / "deb" / "x"
    if not (data / "deb" / ".extracted").exists():
        (data / "deb").mkdir(parents=True, exist_ok=True)
        debs = list((data / "deb").glob(f"{DEB}_*.deb"))
        if not debs:
            log(f"apt-get download {DEB}")
            if run(["apt-get", "download", DEB], cwd=data / "deb", check=False, timeout=1200).returncode:
                run(["apt-get", "update", "-q"], check=False, timeout=600)
                run(["apt-get", "download", DEB], cwd=data / "deb", timeout=1200)
            debs = list((data / "deb").glob(f"{DEB}_*.deb"))
        shutil.rmtree(x, ignore_errors=True)
        run(["dpkg", "-x", str(debs[0]), str(x)])
        (data / "deb" / ".extracted").touch()
    bams = sorted(x.rglob("*.bam.gz"))
    if not bams:
        raise RuntimeError(f"no BAM files in {DEB}")
    return bams


def source_fastq(data):
    """All distinct reads of the drop-seq BAMs as one FASTQ (files whose reads repeat another's are left out)."""
    src = data / "source.fastq"
    if src.exists() and src.stat().st_size > 0:
        return src
    # Callers other than bench/run (scripts/cluster) come here on a fresh machine too.
    if ensure_packages(["samtools"])["samtools"]:
        raise RuntimeError("samtools is needed to make the FASTQ and could not be installed")
    log("samtools fastq over the drop-seq BAMs")
    seen = set()

    def write(f):
        for bam in drop_seq_bams(data):
            p = subprocess.run(f"zcat '{bam}' | samtools fastq - 2>/dev/null", shell=True, capture_output=True)
            if p.stdout and hash(p.stdout) not in seen:
                seen.add(hash(p.stdout))
                f.write(p.stdout)
        if not seen:
            raise RuntimeError(f"samtools fastq found no reads in {DEB}'s BAMs")
    atomic_write(src, write)
    return src


def cut_records(blob, limit, record_lines):
    """The longest prefix of `blob`, at most `limit` bytes, that ends after a whole record."""
    pos = n = last = 0
    while True:
        nl = blob.find(b"\n", pos, limit)
        if nl < 0:
            return blob[:last]
        pos, n = nl + 1, n + 1
        if n % record_lines == 0:
            last = pos


def write_sized(f, blob, size, record_lines):
    """`blob`'s records repeated (records are compressed independently, so repetition does not inflate
    per-record ratios) or cut at a record boundary, to about `size` bytes."""
    if not blob:
        raise RuntimeError("no data to repeat (an empty source file)")
    left = size
    while left >= len(blob):
        f.write(blob)
        left -= len(blob)
    f.write(cut_records(blob, left, record_lines))


def sized_copy(src, dst, size, record_lines):
    if not dst.exists():
        atomic_write(dst, lambda f: write_sized(f, src.read_bytes(), size, record_lines))
    return dst


def random_file(path, size):
    if not path.exists():
        atomic_write(path, lambda f: [f.write(os.urandom(MiB)) for _ in range(size // MiB)])
    return path


def fio90_file(path, size, pct=90, chunk=16 << 10):
    """fio's buffer_compress_percentage=90 buffer_compress_chunk=16K fill: in every 16 KiB chunk, 90% of
    fixed bytes (zeros) then 10% random bytes (fio's fill_random_buf_percentage)."""
    if not path.exists():
        fixed = chunk * pct // 100

        def write(f):
            for _ in range(size // chunk):
                f.write(bytes(fixed))
                f.write(os.urandom(chunk - fixed))
        atomic_write(path, write)
    return path


def sam_file(data, size):
    """A SAM (samtools view -h) of the largest drop-seq BAM, records repeated or cut to about `size` bytes."""
    dst = data / f"reads-{size // MiB}M.sam"
    if dst.exists():
        return dst
    bam = max(drop_seq_bams(data), key=lambda p: p.stat().st_size)
    whole = data / "source.sam"
    if not whole.exists():
        atomic_write(whole, lambda f: f.write(run(
            f"zcat '{bam}' | samtools view -h -", shell=True, stdout=subprocess.PIPE, stderr=None,
            text=False).stdout))
    lines = whole.read_bytes().split(b"\n")
    header = b"".join(line + b"\n" for line in lines if line.startswith(b"@"))
    body = b"".join(line + b"\n" for line in lines if line and not line.startswith(b"@"))

    def write(f):
        f.write(header)
        write_sized(f, body, size - len(header), 1)
    atomic_write(dst, write)
    return dst


def prepare_data(args):
    """The data the selected experiments need, made once into the work dir's data cache."""
    data = Path(args.work) / "data"
    data.mkdir(parents=True, exist_ok=True)
    d = {}
    if args.copy_read:
        d["fastq"] = sized_copy(source_fastq(data), data / f"reads-{args.size}M.fastq", args.size * MiB, 4)
        d["random"] = random_file(data / f"random-{args.other_size}M.bin", args.other_size * MiB)
        d["fio90"] = fio90_file(data / f"fio90-{args.other_size}M.bin", args.other_size * MiB)
    if "app" in args.experiments:
        d["sam"] = sam_file(data, args.sam_size * MiB)
    d.update(workloads.prepare(data, args))
    return d


# ----------------------------------------------------------------------------- systems

def du_ratio(path):
    os.sync()
    st = os.stat(path)
    return st.st_size / max(1, st.st_blocks * 512), st.st_blocks * 512


class System:
    """One file system under test. `path` is where files go; `pids()` its own processes."""
    family = "other"
    needs = ()

    def __init__(self, env, name, sid, alg=None):
        self.env, self.name, self.id, self.alg = env, name, sid, alg
        self.mnt = env.work / "mnt" / sid
        self.path = self.mnt

    def check(self):
        """Raise Skip with the reason when this system cannot be set up here."""
        for p in self.needs:
            if self.env.pkgs.get(p):
                raise Skip(self.env.pkgs[p])

    def setup(self, cpus):
        self.mnt.mkdir(parents=True, exist_ok=True)

    def teardown(self):
        pass

    def pids(self):
        return []

    def cold(self):
        """Make the next read cold: the daemon's own caches too (drop_caches follows)."""

    def sync(self):
        """Everything written so far is compressed and on the disk (timed, after an fsync of the file)."""
        os.sync()

    def ratio(self, f):
        r, used = du_ratio(f)
        return {"ratio": r, "used": used, "ratio_source": "du"}


def loop_fs(env, sid, mkfs, at, options=None):
    """A fresh file system on a sparse image behind a loop device (direct I/O, so the host's page
    cache does not serve it twice), mounted at `at`: what btrfs gets, and (--lower ext4) the lower
    of bare and of the FUSE systems, so they all start from a new file system of the same kind of
    disk. Returns the cleanup tokens, last first to pop."""
    img = env.work / "img" / f"{sid}.img"
    img.parent.mkdir(exist_ok=True)
    img.unlink(missing_ok=True)
    run(["truncate", "-s", f"{env.img_gib}G", str(img)])
    t_img = CLEAN.push(f"rm {img}", lambda: img.unlink(missing_ok=True))
    try:
        loop = out(["losetup", "--direct-io=on", "-f", "--show", str(img)]).strip()
    except RuntimeError as e:
        CLEAN.pop(t_img)
        raise Skip(f"no loop device: {e}")
    t_loop = CLEAN.push(f"losetup -d {loop}", lambda: run(["losetup", "-d", loop]))
    try:
        run([*mkfs, loop])
        at.mkdir(parents=True, exist_ok=True)
        run(["mount", *(["-o", options] if options else []), loop, str(at)])
    except RuntimeError as e:
        CLEAN.pop(t_loop)
        CLEAN.pop(t_img)
        raise Skip(f"{mkfs[0]} on a loop device failed: {e}")
    return [t_img, t_loop, CLEAN.push(f"unmount {at}", lambda: unmount(at))]


def lower_fs(env, sid, at):
    """The file system under bare and the FUSE systems (--lower): a fresh ext4 on a loop device, or
    the work dir's own (also where no loop device can be had)."""
    if env.lower_fs != "ext4":
        return []
    try:
        return loop_fs(env, sid, ["mkfs.ext4", "-q", "-F"], at)
    except Skip as e:
        log(f"{sid}: {e}: on the work dir's file system instead")
        return []


class Bare(System):
    family = "bare"

    def setup(self, cpus):
        shutil.rmtree(self.mnt, ignore_errors=True)
        super().setup(cpus)
        self.tokens = lower_fs(self.env, self.id, self.mnt)

    def teardown(self):
        for t in reversed(self.tokens):
            CLEAN.pop(t)
        shutil.rmtree(self.mnt, ignore_errors=True)


class FuseDaemon(System):
    """A FUSE file system run in the foreground by us (so we own its pid), over a lower directory."""

    def __init__(self, env, name, sid, alg=None):
        super().__init__(env, name, sid, alg)
        self.lower = env.work / "lower" / sid
        self.proc = None

    def cmd(self):
        raise NotImplementedError

    def setup(self, cpus):
        shutil.rmtree(self.lower, ignore_errors=True)
        self.lower.mkdir(parents=True)
        super().setup(cpus)
        self.token = CLEAN.push(f"remove {self.lower}", lambda: shutil.rmtree(self.lower, ignore_errors=True))
        self.lower_tokens = lower_fs(self.env, self.id, self.lower)
        try:
            self.mount(cpus)
        except Exception:
            for t in reversed(self.lower_tokens):
                CLEAN.pop(t)
            CLEAN.pop(self.token)
            raise

    def mount(self, cpus):
        self.cpus = cpus
        logf = open(self.env.work / f"{self.id}.log", "ab")
        cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *self.cmd()]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=logf, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        logf.close()
        (self.env.work / "pids").mkdir(exist_ok=True)
        (self.env.work / "pids" / self.id).write_text(str(self.proc.pid))
        self.mtoken = CLEAN.push(f"unmount {self.mnt}", self.unmount)
        for _ in range(300):
            if mounted(self.mnt):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = (self.env.work / f"{self.id}.log").read_text(errors="replace")[-400:]
        CLEAN.pop(self.mtoken)
        raise Skip(f"mount failed: {' '.join(cmd)}: {tail.strip()}")

    def umount_cmd(self):
        return ["umount", str(self.mnt)]

    def unmount(self):
        if mounted(self.mnt):
            run(self.umount_cmd(), check=False, timeout=300)
            unmount(self.mnt)
        if self.proc:
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def teardown(self):
        CLEAN.pop(self.mtoken)
        for t in reversed(self.lower_tokens):
            CLEAN.pop(t)
        CLEAN.pop(self.token)

    def pids(self):
        return [self.proc.pid] if self.proc else []

    def cold(self):
        CLEAN.pop(self.mtoken)
        self.mount(self.cpus)


class Densefs(FuseDaemon):
    family = "densefs"

    def __init__(self, env, name, sid, alg=None, extra=""):
        super().__init__(env, name, sid, alg)
        self.extra = extra  # more mount options, e.g. ",io_uring=off"

    def check(self):
        if not self.env.densefs:
            raise Skip("no densefs binary (cargo build --release failed)")

    def cmd(self):
        return [self.env.densefs, "mount", "-f", "-o", f"compression={self.alg},recordsize=128K{self.extra}",
                str(self.lower), str(self.mnt)]

    def umount_cmd(self):  # waits until everything is written back
        return [self.env.densefs, "umount", str(self.mnt)]

    def ratio(self, f):
        v = out([self.env.densefs, "get", "-H", "-p", "-o", "value", "compressratio,used", str(f)]).split()
        return {"ratio": float(v[0]), "used": int(v[1]), "ratio_source": "densefs get compressratio"}


class Bindfs(FuseDaemon):
    family = "bindfs"
    needs = ("bindfs",)

    def cmd(self):
        return ["bindfs", "-f", str(self.lower), str(self.mnt)]


class Btrfs(System):
    family = "btrfs"
    needs = ("btrfs-progs", "btrfs-compsize")

    def check(self):
        super().check()
        if "btrfs" not in Path("/proc/filesystems").read_text():
            run(["modprobe", "btrfs"], check=False)
            if "btrfs" not in Path("/proc/filesystems").read_text():
                raise Skip("the kernel has no btrfs")

    def setup(self, cpus):
        super().setup(cpus)
        self.tokens = loop_fs(self.env, self.id, ["mkfs.btrfs", "-f", "-q"], self.mnt, f"compress-force={self.alg}")

    def teardown(self):
        for t in reversed(self.tokens):
            CLEAN.pop(t)

    def ratio(self, f):
        os.sync()
        for line in out(["compsize", "-b", str(f)]).splitlines():
            if line.startswith("TOTAL"):
                _, _, disk, unc, _ = line.split()
                return {"ratio": int(unc) / max(1, int(disk)), "used": int(disk), "ratio_source": "compsize"}
        raise RuntimeError("compsize printed no TOTAL")


class ZfsFuse:
    """The zfs-fuse daemon (one per phase, started pinned like everything else) and its pool."""

    def __init__(self, env):
        self.env, self.pid, self.cpus = env, None, None
        self.pool = f"densebench{env.work.name.replace('-', '')}"[:30]
        self.img = env.work / "img" / "zpool.img"
        self.pidfile = env.work / "zfs-fuse.pid"

    def running_elsewhere(self):
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != self.pid and pid_cmd(d).split(" ")[0].endswith("zfs-fuse") \
                    and pid_alive(d):
                return int(d)
        return None

    def start(self, cpus):
        if self.pid and self.cpus == cpus:
            return
        self.stop()
        other = self.running_elsewhere()
        if other:
            raise Skip(f"a zfs-fuse daemon not started by the benchmark is running (pid {other})")
        self.token = CLEAN.push("stop zfs-fuse", self.stop)
        cpu = ",".join(map(str, sorted(cpus)))
        run(["taskset", "-c", cpu, "zfs-fuse", "--no-kstat-mount", "-p", str(self.pidfile)])
        for _ in range(100):
            if self.pidfile.exists() and self.pidfile.read_text().strip():
                break
            time.sleep(0.1)
        self.pid, self.cpus = int(self.pidfile.read_text().strip()), cpus
        for _ in range(100):
            if run(["zpool", "list"], check=False).returncode == 0:
                break
            time.sleep(0.1)
        if run(["zpool", "list", self.pool], check=False).returncode == 0:  # left by a killed run
            run(["zpool", "destroy", "-f", self.pool], check=False, timeout=120)
        self.img.parent.mkdir(exist_ok=True)
        self.img.unlink(missing_ok=True)
        run(["truncate", "-s", f"{self.env.img_gib * 2}G", str(self.img)])
        # cachefile=none: never recorded in zpool.cache, so no later zfs-fuse imports it on start
        run(["zpool", "create", "-f", "-o", "cachefile=none", "-m", "none", self.pool, str(self.img)])

    def stop(self):
        if not self.pid:
            return
        if pid_alive(self.pid):
            run(["zpool", "destroy", "-f", self.pool], check=False, timeout=120)
            stop_pid(self.pid)
        self.pid = None
        self.img.unlink(missing_ok=True)
        self.pidfile.unlink(missing_ok=True)
        CLEAN.stack[:] = [t for t in CLEAN.stack if t[0] != "stop zfs-fuse"]

    def cycle(self):
        """Export and import the pool: commits everything and empties the ARC (a cold cache)."""
        run(["zpool", "export", self.pool], timeout=300)
        run(["zpool", "import", "-o", "cachefile=none", "-d", str(self.img.parent), self.pool], timeout=300)


class Zfs(System):
    family = "zfs-fuse"
    needs = ("zfs-fuse",)

    def setup(self, cpus):
        super().setup(cpus)
        self.env.zfs.start(cpus)
        self.ds, self.fresh = f"{self.env.zfs.pool}/{self.alg}", False
        run(["zfs", "create", "-o", f"compression={self.alg}", "-o", f"mountpoint={self.mnt}", self.ds])
        self.token = CLEAN.push(f"zfs destroy {self.ds}",
                                lambda: run(["zfs", "destroy", "-r", "-f", self.ds], check=False, timeout=300))

    def teardown(self):
        CLEAN.pop(self.token)

    def pids(self):
        return [self.env.zfs.pid]

    def sync(self):
        # zfs-fuse has no `zpool sync` and FUSE no syncfs: setting a property is a sync task, which
        # returns once the open transaction group, compressed, is on the disk.
        os.sync()
        run(["zfs", "set", f"densebench:sync={time.time()}", self.ds], timeout=None)

    def cold(self):
        if not self.fresh:  # ratio() has just cycled the pool
            self.env.zfs.cycle()
        self.fresh = False

    def ratio(self, f):
        self.env.zfs.cycle()  # the ratio is known once the transaction group is written
        self.fresh = True
        v = out(["zfs", "get", "-H", "-p", "-o", "value", "compressratio,used", self.ds]).split()
        return {"ratio": float(v[0].rstrip("x")), "used": int(v[1]), "ratio_source": "zfs get compressratio",
                "ratio_du": du_ratio(f)[0]}


DENSEFS_ALGS = ["off", "lz4", "gzip-1", "gzip-6", "gzip-9", "zstd-1", "zstd-3", "lzjb", "zle"]
BTRFS_ALGS = ["lzo", "zlib:1", "zlib:6", "zlib:9", "zstd:1", "zstd:3"]
ZFS_ALGS = ["gzip-1", "gzip-6", "gzip-9", "lzjb", "zle"]


def all_systems(env):
    s = [Bare(env, "bare dir", "bare"), Bindfs(env, "bindfs", "bindfs")]
    s += [Densefs(env, f"densefs {a}", f"densefs-{a}", a) for a in DENSEFS_ALGS]
    # Requests through /dev/fuse instead of io_uring's per-CPU queues (where the kernel has them).
    s += [Densefs(env, f"densefs {a} /dev/fuse", f"densefs-{a}-devfuse", a, ",io_uring=off") for a in ("lz4", "zstd-3")]
    s += [Btrfs(env, f"btrfs {a}", f"btrfs-{a.replace(':', '')}", a) for a in BTRFS_ALGS]
    s += [Zfs(env, f"zfs-fuse {a}", f"zfs-{a}", a) for a in ZFS_ALGS]
    return s


# ----------------------------------------------------------------------------- experiments

def warm(path):
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exp_copy(system, src, dst, cpus):
    """1: cp from page cache, then fsync the copy and sync (the daemons write back on fsync)."""
    warm(src)
    os.sync()  # others' dirty data is not ours to time
    with Meter(cpus, system.pids()) as r:
        run(["cp", str(src), str(dst)], timeout=None)  # (a timeout makes Popen.wait poll: 50 ms steps)
        fsync_path(dst)
        system.sync()
    r["mb_s"] = src.stat().st_size / 1e6 / r["seconds"]
    return r


def exp_read(system, src, dst, cpus, verify):
    """2: cold read: the daemon's caches dropped (remount / pool export+import), then drop_caches."""
    system.cold()
    drop_caches()
    with Meter(cpus, system.pids()) as r:
        run(["cat", str(dst)], stdout=subprocess.DEVNULL, timeout=None)
    r["mb_s"] = src.stat().st_size / 1e6 / r["seconds"]
    if verify:
        run(["cmp", str(src), str(dst)])
        r["verified"] = True
    return r


def steals(runs):
    """Each run's CPU seconds the VM's host took from the cores in use (/proc/stat's steal)."""
    return [r.get("cpu_steal_s", 0.0) for r in runs]


def best_run(runs):
    """The fastest of the runs: on a shared machine, other work only ever adds time."""
    return min(runs, key=lambda r: r["seconds"])


def exp_copy_read(system, src, ds, cpus, args):
    """1 and 2 on one data set. Runs whose copy + read take under --rep-limit seconds are repeated
    (--reps in all) and the best kept: short runs are the noisy ones on a shared machine."""
    dst = system.path / src.name
    rec = {"system": system.id, "cores": len(cpus), "data": ds, "bytes": src.stat().st_size}
    copies, reads = [], []
    try:
        for i in range(args.reps):
            copies.append(exp_copy(system, src, dst, cpus))
            if i == 0:
                rec.update(system.ratio(dst))
            reads.append(exp_read(system, src, dst, cpus, args.verify))
            dst.unlink()
            if copies[0]["seconds"] + reads[0]["seconds"] > args.rep_limit:
                break
        rec.update(copy=best_run(copies), read=best_run(reads), runs=len(copies),
                   copy_all_s=[c["seconds"] for c in copies], read_all_s=[r["seconds"] for r in reads],
                   copy_all_steal_s=steals(copies), read_all_steal_s=steals(reads))
        c, rd = rec["copy"], rec["read"]
        log(f"{system.name:18} {ds:6} {len(cpus)}c x{len(copies)}: copy {c['seconds']:6.2f}s "
            f"ratio {rec['ratio']:.2f} read {rd['seconds']:5.2f}s cpu {c['cpu_busy_s']:.1f}s "
            f"fs {c['fs_cpu_s'] if c['fs_cpu_s'] is not None else '-'}")
    except Exception as e:
        rec["error"] = str(e)
        log(f"{system.name}: {ds}: {e}")
    dst.unlink(missing_ok=True)
    return rec


def fio_job(path, rw, bs, qd, size, runtime, cpus, pids):
    cmd = ["fio", "--output-format=json", "--name=bench", f"--filename={path}", f"--size={size}",
           f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--ioengine=libaio", "--direct=1",
           "--buffer_compress_percentage=90", "--buffer_compress_chunk=16k", "--fallocate=none",
           "--time_based=1", f"--runtime={runtime}", "--overwrite=1"]
    if "write" in rw:
        cmd.append("--end_fsync=1")
    if "read" in rw:
        drop_caches()
    with Meter(cpus, pids) as m:
        p = run(cmd, check=False, stderr=subprocess.PIPE, timeout=None)
    if p.returncode:
        raise RuntimeError(f"fio {rw} bs={bs} iodepth={qd}: {(p.stderr or p.stdout)[-300:]}")
    j = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]["read" if "read" in rw else "write"]
    m.update(rw=rw, bs=bs, iodepth=qd, iops=j["iops"], mb_s=j["bw_bytes"] / 1e6)
    return m


def exp_fio(system, grid, size, runtime, cpus):
    """4: NoLoad's fio runs: lay the file out once (90%-compressible), then the grid; reads after writes."""
    d = system.path / "fio"
    d.mkdir(exist_ok=True)
    f = d / "fio.dat"
    run(["fio", "--name=layout", f"--filename={f}", f"--size={size}", "--rw=write", "--bs=1M",
         "--ioengine=libaio", "--direct=1", "--iodepth=4", "--buffer_compress_percentage=90",
         "--buffer_compress_chunk=16k", "--fallocate=none", "--end_fsync=1"], timeout=900)
    res = {"jobs": [], "file_ratio": None}
    try:
        res["file_ratio"] = system.ratio(f)["ratio"]
    except Exception as e:
        res["file_ratio_error"] = str(e)
    for rw in ("write", "randwrite", "read", "randread"):
        for bs, qd in grid:
            try:
                res["jobs"].append(fio_job(f, rw, bs, qd, size, runtime, cpus, system.pids()))
            except Exception as e:
                res["jobs"].append({"rw": rw, "bs": bs, "iodepth": qd, "error": str(e)})
    f.unlink(missing_ok=True)
    return res


def exp_samtools(system, sam, cpus, reps):
    """5: samtools sort -@2 reading the SAM from, and writing temporaries and the BAM to, the system;
    the best of `reps` runs, each from a cold cache."""
    d = system.path / "sam"
    d.mkdir(exist_ok=True)
    warm(sam)
    run(["cp", str(sam), str(d / "in.sam")])
    fsync_path(d / "in.sam")
    sorts = []
    for _ in range(reps):
        system.cold()
        drop_caches()
        with Meter(cpus, system.pids()) as r:
            run(["samtools", "sort", "-@2", "-m", "32M", "-o", str(d / "out.bam"), "-T", str(d / "tmp"),
                 str(d / "in.sam")], timeout=None)
            fsync_path(d / "out.bam")
            system.sync()
        sorts.append(r)
        (d / "out.bam").unlink()
    shutil.rmtree(d, ignore_errors=True)
    return dict(best_run(sorts), all_s=[r["seconds"] for r in sorts], all_steal_s=steals(sorts))


# ----------------------------------------------------------------------------- phases

def idle_policy():
    """How idle cores wait: FUSE's small-file steps hang on it (see workloads.ONE_CORE)."""
    def read(path):
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None
    return {"cpuidle_driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
            "cpuidle_governor": read("/sys/devices/system/cpu/cpuidle/current_governor"),
            "guest_halt_poll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")}


def set_wq_cpumask(cpus):
    """Unbound kernel workqueues (btrfs compresses in them) follow the pinning too."""
    f = Path("/sys/devices/virtual/workqueue/cpumask")
    try:
        old = f.read_text().strip()
        f.write_text(format(sum(1 << c for c in cpus), "x") + "\n")
        return lambda: f.write_text(old + "\n")
    except OSError:
        return None


def copy_read_in(args, full):
    """Whether copy + read run in a phase: the 1-core phase repeats them only for `cores`."""
    return args.copy_read and (full or "cores" in args.experiments)


def workloads_in(args, full):
    """The workloads a phase runs: all selected ones on all cores; smallfiles on 1 core too, where
    the client and the file system share one core (no wake-ups across cores, see workloads.py)."""
    return [w for w in workloads.EXPERIMENTS if w in args.experiments and (full or w in workloads.ONE_CORE)]


def runs_on(env, s, full):
    """Whether a selected experiment runs on system `s` in a phase (`full`: the all-cores one)."""
    ex = env.args.experiments
    return copy_read_in(env.args, full) or full and (s.id in env.fio_systems and "fio" in ex or
                                                     s.id in env.app_systems and "app" in ex) or \
        s.id in env.wl_systems and bool(workloads_in(env.args, full))


def phase(env, cpus, systems, data, args, full):
    """Run the experiments with everything pinned to `cpus` (the harness, clients, daemons)."""
    label = f"{len(cpus)} core" + ("s" if len(cpus) > 1 else "")
    log(f"=== phase: {label} (cpus {sorted(cpus)})")
    old_aff = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    undo_wq = None
    if any(isinstance(s, Btrfs) for s in systems):
        undo_wq = set_wq_cpumask(cpus)
        if undo_wq:
            wq_token = CLEAN.push("restore workqueue cpumask", undo_wq)
    datasets = ["fastq", "random", "fio90"] if full else ["fastq"]
    ex = args.experiments
    try:
        for s in systems:
            if not runs_on(env, s, full):
                continue
            try:
                s.check()
                s.setup(cpus)
            except Skip as e:
                env.skip(s, f"{label}: {e}")
                continue
            except Exception as e:
                env.skip(s, f"{label}: setup failed: {e}")
                continue
            try:
                for ds in datasets if copy_read_in(args, full) else []:
                    rec = exp_copy_read(s, data[ds], ds, cpus, args)
                    env.results["copy"].append(rec)
                if full and s.id in env.fio_systems and "fio" in ex:
                    try:
                        r = exp_fio(s, env.fio_grid, env.fio_size, env.fio_runtime, cpus)
                        log(f"{s.name:18} fio: " + " ".join(
                            f"{j['rw']}/{j['bs']}/{j['iodepth']}={j.get('mb_s', 0):.0f}MB/s" for j in r["jobs"]))
                    except Exception as e:
                        r = {"error": str(e), "jobs": []}
                        log(f"{s.name}: fio: {e}")
                    r.update(system=s.id, cores=len(cpus))
                    env.results["fio"].append(r)
                if full and s.id in env.app_systems and "app" in ex:
                    try:
                        r = exp_samtools(s, data["sam"], cpus, min(args.reps, 2))
                        log(f"{s.name:18} samtools sort: {r['seconds']:.2f}s")
                    except Exception as e:
                        r = {"error": str(e)}
                        log(f"{s.name}: samtools: {e}")
                    r.update(system=s.id, cores=len(cpus), bytes=data["sam"].stat().st_size)
                    env.results["samtools"].append(r)
                if s.id in env.wl_systems:
                    workloads.run_all(env, s, data, cpus, args, workloads_in(args, full))
            finally:
                s.teardown()
    finally:
        env.zfs.stop()
        if undo_wq:
            CLEAN.pop(wq_token)
        os.sched_setaffinity(0, old_aff)


# ----------------------------------------------------------------------------- setup and main

class Env:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work).resolve()
        self.img_gib = args.img_gib
        self.lower_fs = args.lower
        self.results = {"copy": [], "fio": [], "samtools": [], "smallfiles": [], "bigread": [], "fsync": [], "bigdir": [],
                        "skipped": [], "systems": {}}
        self.pkgs = {}
        self.densefs = None
        self.zfs = ZfsFuse(self)

    def skip(self, s, reason):
        log(f"SKIP {s.name}: {reason}")
        self.results["skipped"].append({"system": s.id, "reason": reason})


ENABLE_URING = Path("/sys/module/fuse/parameters/enable_uring")


def enable_fuse_io_uring(env):
    """FUSE over io_uring (Linux 6.14+) is off unless this kernel switch is set; densefs uses it
    where set (io_uring=auto). Set for the run, put back at exit; recorded in results.json."""
    if not ENABLE_URING.exists():
        env.results["fuse_io_uring"] = "not in this kernel"
        return
    before = ENABLE_URING.read_text().strip()
    if before != "Y":
        ENABLE_URING.write_text("Y")
        CLEAN.push("enable_uring back to N", lambda: ENABLE_URING.write_text(before))
    env.results["fuse_io_uring"] = "enabled (enable_uring=Y)"


def find_densefs():
    for c in (os.environ.get("DENSEFS_BIN"), REPO / "target" / "release" / "densefs", shutil.which("densefs")):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    log("no densefs binary: cargo build --release")
    run(["bash", "-c", '[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"; cargo build --release'], cwd=REPO,
        check=False, quiet=False, timeout=3600)
    c = REPO / "target" / "release" / "densefs"
    return str(c) if c.is_file() else None


def clean_stale(env):
    """Undo what a killed earlier run in this work dir left: daemons, mounts, loop devices."""
    for f in list((env.work / "pids").glob("*")) if (env.work / "pids").exists() else []:
        pid = f.read_text().strip()
        if pid.isdigit() and str(env.work) in pid_cmd(pid):
            stop_pid(int(pid), 10)
        f.unlink()
    mnts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            m = line.split()[4]
            if m.startswith(str(env.work) + "/"):
                mnts.append(m)
    for m in sorted(mnts, key=len, reverse=True):
        log(f"stale mount {m}: unmounting")
        unmount(m)
    if env.zfs.pidfile.exists():
        pid = env.zfs.pidfile.read_text().strip()
        if pid.isdigit() and pid_alive(pid) and "zfs-fuse" in pid_cmd(pid):
            env.zfs.pid = int(pid)
            env.zfs.stop()
        env.zfs.pidfile.unlink(missing_ok=True)
    img = env.work / "img"
    if img.exists():
        for f in img.glob("*.img"):
            for line in out(["losetup", "-j", str(f)], check=False).splitlines():
                run(["losetup", "-d", line.split(":")[0]], check=False)
            f.unlink()
    shutil.rmtree(env.work / "lower", ignore_errors=True)
    shutil.rmtree(env.work / "mnt", ignore_errors=True)


def versions(env):
    v = {}
    for name, cmd in {"densefs": [env.densefs or "true", "--version"], "kernel": ["uname", "-r"]}.items():
        v[name] = out(cmd, check=False).strip()
    v["densefs_git"] = out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False).strip()
    if env.densefs:
        v["densefs_binary"] = f"{env.densefs} built {time.strftime('%Y-%m-%d %H:%M', time.localtime(os.stat(env.densefs).st_mtime))}"
    for p in ("btrfs-progs", "btrfs-compsize", "zfs-fuse", "bindfs", "fio", "samtools"):
        r = run(["dpkg-query", "-W", "-f=${Version}", p], check=False)
        v[p] = r.stdout.strip() if r.returncode == 0 else None
    return v


EXPERIMENTS = ["copy", "read", "cores", "fio", "app", "cost", *workloads.EXPERIMENTS]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="seconds: tiny data, bare + densefs off/lz4, one fio job (CI)")
    ap.add_argument("--out", default=str(HERE / "results"), help="report.md, results.json, PNGs (default bench/results)")
    ap.add_argument("--work", help="scratch and cached data (default /var/tmp/densefs-bench/{full,quick})")
    ap.add_argument("--systems", help="comma-separated ids or families (densefs, btrfs, zfs-fuse, bindfs, bare)")
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS),
                    help=f"comma-separated, default all: {','.join(EXPERIMENTS)} (copy, read and cost are measured "
                    "together; cores adds the 1-core phase)")
    ap.add_argument("--size", type=int, help="FASTQ MiB (default 192; quick 8)")
    ap.add_argument("--other-size", type=int, help="random and fio90 data MiB (default 32; quick 2)")
    ap.add_argument("--sam-size", type=int, help="SAM MiB for samtools sort (default 128; quick 4)")
    ap.add_argument("--big-size", type=int, help="FASTQ MiB for bigread (default 1024; quick 16)")
    ap.add_argument("--bigdir-files", type=int, help="files in bigdir's one directory (default 200000; quick 2000)")
    ap.add_argument("--reps", type=int, help="repetitions of a short copy + read (the best kept) and of smallfiles, "
                    "bigread and bigdir (the median kept) (default 3; quick 1)")
    ap.add_argument("--rep-limit", type=float, default=2.0,
                    help="repeat only when the first copy + read took less than this many seconds")
    ap.add_argument("--full-fio", action="store_true",
                    help="the whole fio grid (bs 4K..1M x iodepth 1..32) on every system: hours")
    ap.add_argument("--no-1core", action="store_true", help="skip the 1-core phase (cores, and smallfiles on 1 core)")
    ap.add_argument("--img-gib", type=int, default=4, help="loop images' (btrfs, ext4 lowers) and the zpool's size in GiB (sparse)")
    ap.add_argument("--lower", choices=("ext4", "dir"), default="ext4",
                    help="where bare and the FUSE systems keep their files: a fresh ext4 on a loop device per system, "
                         "like btrfs's (default), or a directory of the work dir's file system")
    ap.add_argument("--verify", action="store_true", help="cmp every read back with its source (quick: on)")
    a = ap.parse_args(argv)
    a.experiments = [x for x in a.experiments.split(",") if x]
    bad = set(a.experiments) - set(EXPERIMENTS)
    if bad or not a.experiments:
        ap.error(f"--experiments: unknown {','.join(sorted(bad)) or '(none given)'}; choose from {','.join(EXPERIMENTS)}")
    a.copy_read = bool({"copy", "read", "cost", "cores"} & set(a.experiments))
    q = a.quick
    a.size = a.size or (8 if q else 192)
    a.other_size = a.other_size or (2 if q else 32)
    a.sam_size = a.sam_size or (4 if q else 128)
    a.big_size = a.big_size or (16 if q else 1024)
    a.bigdir_files = a.bigdir_files or (2000 if q else 200_000)
    a.verify = a.verify or q
    a.reps = a.reps or (1 if q else 3)
    a.work = a.work or f"/var/tmp/densefs-bench/{'quick' if q else 'full'}"
    return a


def main(argv):
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench/run needs root (mounts, loop devices, drop_caches)")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    env = Env(args)
    env.work.mkdir(parents=True, exist_ok=True)
    outdir = Path(args.out).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    import fcntl
    lock = open(env.work / "lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another bench/run is using {env.work}")
    clean_stale(env)
    workloads.bind(sys.modules[__name__])

    enable_fuse_io_uring(env)
    systems = all_systems(env)
    if args.systems:
        want = set(args.systems.split(","))
        systems = [s for s in systems if s.id in want or s.family in want or s.name in want]
    elif args.quick:
        systems = [s for s in systems if s.id in ("bare", "densefs-off", "densefs-lz4")]
    else:  # the /dev/fuse variants only where named (or in the small-file workloads, workloads.SYSTEMS)
        systems = [s for s in systems if not s.id.endswith("-devfuse") or s.id in workloads.SYSTEMS]
    if not systems:
        sys.exit(f"--systems {args.systems}: no such system (ids: {', '.join(s.id for s in all_systems(env))})")

    if args.full_fio:
        env.fio_grid = [(bs, qd) for bs in ("4k", "16k", "64k", "128k", "1m") for qd in (1, 4, 16, 32)]
        env.fio_systems = {s.id for s in systems}
    elif args.quick:  # one fio job in all
        env.fio_grid = [("128k", 4)]
        env.fio_systems = {"densefs-lz4"} & {s.id for s in systems} or {systems[0].id}
    else:
        env.fio_grid = [("4k", 1), ("4k", 32), ("1m", 32)]
        env.fio_systems = {"bare", "bindfs", "densefs-off", "densefs-lz4", "densefs-zstd-3", "densefs-gzip-6",
                           "btrfs-lzo", "btrfs-zstd3", "zfs-lzjb", "zfs-gzip-6"}
    env.fio_size = "16m" if args.quick else "256m"
    env.fio_runtime = 1 if args.quick else 2
    env.app_systems = {s.id for s in systems}
    # smallfiles, bigread, fsync: by default densefs lz4/zstd-3 beside btrfs lzo/zstd:3, bindfs and bare
    env.wl_systems = {s.id for s in systems} if args.systems or args.quick else set(workloads.SYSTEMS)
    env.fsync_size = "16m" if args.quick else "64m"
    env.fsync_runtime = 1 if args.quick else 5
    systems = [s for s in systems if runs_on(env, s, True)]

    base = ["fio", "samtools", "python3-matplotlib", "fuse3"]
    peers = sorted({p for s in systems for p in s.needs})  # only what the selected systems need
    env.pkgs = ensure_packages(base + peers)
    for p in ("fio", "samtools"):
        if env.pkgs[p]:
            sys.exit(f"cannot run without {p}: {env.pkgs[p]}")
    env.densefs = find_densefs()

    started = time.time()
    res = env.results
    res["meta"] = {
        "mode": "quick" if args.quick else ("full-fio" if args.full_fio else "default"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
        "host": platform.node(), "cpus": os.cpu_count(),
        "cpu_model": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name")), "?"),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "fio_grid": env.fio_grid, "fio_size": env.fio_size, "fio_runtime_s": env.fio_runtime,
        "fio_systems": sorted(env.fio_systems), "args": vars(args), "loadavg_start": os.getloadavg(),
        "experiments": args.experiments, "workload_systems": [s.id for s in systems if s.id in env.wl_systems],
        "fsync_size": env.fsync_size, "fsync_runtime_s": env.fsync_runtime, "idle": idle_policy(),
    }
    steal_start = cpu_ticks(set(range(os.cpu_count() or 1)))[7]
    for s in systems:
        res["systems"][s.id] = {"name": s.name, "family": s.family, "alg": s.alg}
    try:
        log("preparing data")
        data = prepare_data(args)
        res["meta"]["data"] = {k: {"file": v.name, "bytes": v.stat().st_size} for k, v in data.items()}
        if "tree" in data:
            res["meta"]["tree"] = workloads.tree_info(data["tree"])
        res["meta"]["versions"] = versions(env)
        res["meta"]["lower"] = ("a fresh ext4 on a loop device per system (bare and FUSE lowers)" if env.lower_fs == "ext4"
                                else "a directory of the work dir's file system")
        allc = sorted(os.sched_getaffinity(0))
        phase(env, set(allc), systems, data, args, full=True)
        if ("cores" in args.experiments or workloads_in(args, False)) and not args.no_1core and len(allc) > 1:
            phase(env, {allc[0]}, systems, data, args, full=False)
    finally:
        CLEAN.all()
        res["meta"]["seconds"] = time.time() - started
        res["meta"]["loadavg_end"] = os.getloadavg()
        res["meta"]["steal_s"] = (cpu_ticks(set(range(os.cpu_count() or 1)))[7] - steal_start) / CLK
        (outdir / "results.json").write_text(json.dumps(res, indent=1, default=str))
        log(f"wrote {outdir / 'results.json'}")
    report.make(res, outdir)
    log(f"wrote {outdir / 'report.md'} ({res['meta']['seconds']:.0f}s)")


if __name__ == "__main__":
    main(sys.argv[1:])
