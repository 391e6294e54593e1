"""The data and the checks of `scripts/cluster`: one workload run against any Deployment.

Data (made once into the data cache, DENSEFS_CLUSTER_DATA or /var/tmp/densefs-cluster/data):
  - the real FASTQ of bench/harness.py (drop-seq reads): quick 16 MiB, full 192 MiB;
  - a small-file tree: quick a few hundred files of /usr/include/linux, full /usr/include +
    /usr/share/doc (~14k files, the issue's untar), plus entries that break naive copies: symlinks
    (relative, absolute, dangling, to a directory), hard links, user.* xattrs on files and
    directories, odd names, empty files, a sparse file, modes. Kept as a directory (the reference
    for rsync) and as a tar (what is copied in, like the issue's untar) with a sha256 manifest.

run_one(dep): setup -> FASTQ in (timed, fsync'd, wire bytes) -> tree untarred in (timed, synced, wire
bytes) -> verify -> stop every daemon -> start again -> FASTQ read back cold (timed, sha256) -> tree
verified again (sha256 of every file, `rsync -aHAXn --itemize-changes` prints nothing) -> the
deployment's own checks -> figures. Any difference raises rig.Mismatch.
"""
import hashlib
import os
import shutil
import time
from pathlib import Path

from . import rig as R
from .rig import MiB, Mismatch, h, log, run

FASTQ_MIB = {True: 16, False: 192}
QUICK_TREE_FILES = 300
FULL_TREE_FILES_EACH = 7000  # of /usr/include and of /usr/share/doc: ~14k files, as the untar


def data_dir():
    d = Path(os.environ.get("DENSEFS_CLUSTER_DATA", "/var/tmp/densefs-cluster/data"))
    d.mkdir(parents=True, exist_ok=True)
    return d


# ----------------------------------------------------------------------------- data

def fastq(quick):
    """The FASTQ of the run, cut from harness's source FASTQ (reused from bench's cache when there)."""
    data = data_dir()
    src = data / "source.fastq"
    if not src.exists():
        cached = sorted(Path("/var/tmp/densefs-bench").glob("*/data/source.fastq"))
        if cached:
            os.link(cached[0], src) if cached[0].stat().st_dev == data.stat().st_dev else shutil.copy(cached[0], src)
    src = h.source_fastq(data)
    n = FASTQ_MIB[quick]
    return h.sized_copy(src, data / f"reads-{n}M.fastq", n * MiB, 4)


def _copy_some(dst, sources, limit):
    """Copy regular files, symlinks and dirs of each of `sources` (its first `limit` files, sorted)
    under dst."""
    for src in sources:
        _copy_one(dst, src, limit)


def _copy_one(dst, src, limit):
    n = 0
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(files):
            if n >= limit:
                return
            s = Path(root) / name
            d = dst / s.relative_to("/")
            d.parent.mkdir(parents=True, exist_ok=True)
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
            elif s.is_file():
                shutil.copy2(s, d)
                n += 1


def _specials(top):
    """The entries a careless copy loses: links, xattrs, odd names, empty and sparse files, modes."""
    s = top / "specials"
    (s / "deep/a/b/c/d/e").mkdir(parents=True)
    (s / "deep/a/b/c/d/e/leaf.txt").write_text("deep leaf\n")
    for name in ("empty", "sp ace", "ünïcødé €", "-dash", "quote'\"", "#hash", "x" * 200):
        (s / name).write_bytes(b"" if name == "empty" else f"{name}\n".encode())
    (s / "original.txt").write_text("hard-linked three times\n" * 50)
    os.link(s / "original.txt", s / "link1.txt")
    os.link(s / "original.txt", s / "deep/a/link2.txt")
    os.symlink("original.txt", s / "sym-rel")
    os.symlink("/etc/hostname", s / "sym-abs")
    os.symlink("no/such/target", s / "sym-dangling")
    os.symlink("deep/a", s / "sym-dir")
    os.setxattr(s / "original.txt", "user.origin", b"densefs cluster test")
    os.setxattr(s / "original.txt", "user.empty", b"")
    os.setxattr(s / "deep", "user.dir", b"on a directory")
    os.setxattr(s / "sp ace", "user.binary", bytes(range(256)))
    with open(s / "sparse.bin", "wb") as f:
        f.seek(3 * MiB)
        f.write(b"end of a sparse file\n")
    (s / "random.bin").write_bytes(os.urandom(MiB))
    (s / "secret").write_text("mode 0600\n")
    os.chmod(s / "secret", 0o600)
    (s / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(s / "tool.sh", 0o755)
    os.chmod(s / "deep/a/b", 0o711)


def tree(quick):
    """(directory, tar, manifest {relative path: sha256}) of the small-file tree, made once."""
    data = data_dir()
    name = "tree-quick" if quick else "tree-full"
    top, tar, done = data / name, data / f"{name}.tar", data / f"{name}.complete"
    if not done.exists() or not tar.exists():
        log(f"making the small-file tree {top}")
        shutil.rmtree(top, ignore_errors=True)
        top.mkdir()
        _copy_some(top, ["/usr/include/linux"] if quick else ["/usr/include", "/usr/share/doc"],
                   QUICK_TREE_FILES if quick else FULL_TREE_FILES_EACH)
        _specials(top)
        os.utime(top, (1.7e9, 1.7e9))
        run(["tar", "--xattrs", "--xattrs-include=user.*", "-cf", f"{tar}.tmp", "-C", str(top), "."], timeout=1800)
        os.replace(f"{tar}.tmp", tar)
        done.touch()
    return top, tar, manifest(top)


def sha256_file(path):
    d = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            d.update(chunk)
    return d.hexdigest()


def manifest(top):
    m = {}
    for root, _dirs, files in os.walk(top):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                m[str(p.relative_to(top))] = sha256_file(p)
    return m


def tree_stats(top):
    files = links = dirs = size = 0
    for root, ds, fs in os.walk(top):
        dirs += len(ds)
        for name in fs:
            p = Path(root) / name
            if p.is_symlink():
                links += 1
            else:
                files += 1
                size += p.stat().st_size
    return {"files": files, "symlinks": links, "dirs": dirs, "bytes": size}


# ----------------------------------------------------------------------------- checks

def verify_tree(dep, src, mani, rel, when):
    """sha256 of every regular file and `rsync -aHAXn --itemize-changes` (names, links, modes, times,
    xattrs, ACLs) of the tree as the deployment shows it, against the source."""
    view = dep.tree_view(rel)
    got = {}
    for path in mani:
        p = Path(view) / path
        if not p.is_file():
            raise Mismatch(f"{dep.label} {when}: {rel}/{path} is missing")
        got[path] = sha256_file(p)
    bad = [p for p in mani if got[p] != mani[p]]
    if bad:
        raise Mismatch(f"{dep.label} {when}: {len(bad)} files differ, e.g. {rel}/{bad[0]}")
    p = run(["rsync", dep.rsync_flags, "--itemize-changes", "--delete", f"{src}/", f"{view}/"],
            check=False, timeout=600)
    if p.returncode != 0 or p.stdout.strip():
        raise Mismatch(f"{dep.label} {when}: rsync {dep.rsync_flags} --itemize-changes (exit {p.returncode}):\n"
                       + "\n".join(p.stdout.strip().splitlines()[:20]))


def read_sha(dep, rel):
    d, n = hashlib.sha256(), [0]

    def sink(chunk):
        d.update(chunk)
        n[0] += len(chunk)
    dep.read_file(rel, sink)
    return d.hexdigest(), n[0]


def verify_fastq(dep, rel, want, when):
    got, n = read_sha(dep, rel)
    if got != want:
        raise Mismatch(f"{dep.label} {when}: {rel} read back differs ({n} bytes, sha256 {got[:16]}…)")


# ----------------------------------------------------------------------------- the run

class Timer:
    """Wall time and bytes on the wire (the host bridge) of one step."""

    def __init__(self, dep):
        self.dep = dep

    def __enter__(self):
        self.w0, self.t0 = self.dep.rig.wire_bytes(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.wire = self.dep.rig.wire_bytes() - self.w0
        return False


def storage_figures(dep):
    """What the servers store, and densefs's ratio on its lowers (logical bytes / allocated bytes)."""
    os.sync()
    f = {"stored_bytes": sum(R.du_bytes(d) for d in dep.store_dirs),
         "stored_apparent_bytes": sum(R.du_bytes(d, apparent=True) for d in dep.store_dirs)}
    if dep.densefs:
        logical = sum(R.du_bytes(m, apparent=True) for m in dep.densefs_mounts)
        lowers = sum(R.du_bytes(d) for d in dep.densefs_lowers)
        f.update(logical_bytes=logical, lower_bytes=lowers,
                 lower_apparent_bytes=sum(R.du_bytes(d, apparent=True) for d in dep.densefs_lowers),
                 ratio=logical / max(1, lowers))
    return f


def run_one(dep, quick):
    """The whole workload on one deployment; returns its figures (raises Mismatch on a difference)."""
    fq = fastq(quick)
    src, tar, mani = tree(quick)
    want = sha256_file(fq)
    size = fq.stat().st_size
    r = {"deployment": dep.name, "densefs": dep.densefs, "fastq_bytes": size}
    t0 = time.perf_counter()
    log(f"{dep.label}: setting up")
    if R.mounts_under(dep.dir):
        raise RuntimeError(f"{dep.dir} has mounts left: {R.mounts_under(dep.dir)}")
    shutil.rmtree(dep.dir, ignore_errors=True)  # no bricks or lowers of an earlier run
    dep.setup()
    r["setup_s"] = time.perf_counter() - t0
    log(f"{dep.label}: FASTQ in ({size / MiB:.0f} MiB)")
    with Timer(dep) as t:
        dep.write_file(fq, "reads.fastq")
    r.update(write_s=t.seconds, write_mb_s=size / t.seconds / 1e6, write_wire_bytes=t.wire)
    log(f"{dep.label}: tree in ({len(mani)} files)")
    with Timer(dep) as t:
        dep.copy_tree(tar, "tree")
    r.update(tree_s=t.seconds, tree_wire_bytes=t.wire)
    verify_fastq(dep, "reads.fastq", want, "after writing")
    verify_tree(dep, src, mani, "tree", "after writing")
    log(f"{dep.label}: stopping and starting every daemon")
    t0 = time.perf_counter()
    dep.stop()
    dep.start()
    r["restart_s"] = time.perf_counter() - t0
    R.drop_caches()
    with Timer(dep) as t:
        got, n = read_sha(dep, "reads.fastq")
    if got != want or n != size:
        raise Mismatch(f"{dep.label} after a restart: reads.fastq read back differs ({n} of {size} bytes)")
    r.update(read_s=t.seconds, read_mb_s=size / t.seconds / 1e6, read_wire_bytes=t.wire)
    verify_tree(dep, src, mani, "tree", "after a restart")
    r.update(storage_figures(dep))
    dep.checks()
    r.update(dep.extra)
    return r


def run_pair(rig, name, factory, quick, keep=False):
    """`name` without densefs (the baseline), then with; each torn down after its run, but for the
    densefs one when `keep` (left up for debugging). Returns (figures list, errors list)."""
    results, errors = [], []
    for with_densefs in (False, True):
        mark = rig.mark()
        dep = factory(rig, with_densefs)
        t0 = time.perf_counter()
        try:
            r = run_one(dep, quick)
            r["seconds"] = time.perf_counter() - t0
            results.append(r)
            log(f"{dep.label}: ok ({r['seconds']:.1f}s)")
        except Exception as e:  # one failed variant does not stop the other
            errors.append(f"{dep.label}: {e}")
            log(f"{dep.label}: FAILED: {e}")
            results.append({"deployment": name, "densefs": with_densefs, "error": str(e),
                            **dep.extra})
        finally:
            if not (keep and with_densefs):
                rig.teardown_since(mark)
    return results, errors
