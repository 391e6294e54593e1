"""MooseFS deployments (Debian moosefs-master/-chunkserver/-client/-cli 3.0.117): a master and two
chunkservers, each in its own network namespace, the client an mfsmount on the host. Every daemon
gets its own config file and data directory (MooseFS's defaults are /etc/mfs and /var/lib/mfs),
runs in the foreground and is stopped by its pid. The default goal (2 copies) is kept, so each
chunkserver holds every chunk; the second copy travels chunkserver to chunkserver.

  moosefs         each chunkserver's chunk directory (its mfshdd.cfg line) is a densefs mount on
                  that server (the servers compress)
  moosefs-client  plain chunkservers; densefs mounted over the host's mfsmount (the client compresses)

MooseFS counts a file's length, not its blocks, in `mfsdirinfo` and quotas. densefs's container files
are sparse with about twice the logical length (docs/FORMAT.md, "Sparse fixed slots"), so with densefs
over mfsmount MooseFS reports about 2x: the figures `mfs_length_bytes` etc. (`mfsdirinfo` of what the
client wrote, seen from the MooseFS side) against `data_bytes` (the files' logical bytes) show by how
much. `ratio` here is data_bytes x copies / bytes allocated on the chunkservers' disks (see
_ratio_figures), the same measure for the baseline and densefs; `fastq_ratio` the same for the FASTQ's
chunks alone.
"""
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
from pathlib import Path

from .rig import Deployment, du_bytes, kill_pids, log, mounted, run, unmount, wait_for

PACKAGES = ["moosefs-master", "moosefs-chunkserver", "moosefs-client", "moosefs-cli", "rsync", "attr", "fuse3"]
EMPTY_METADATA = Path("/var/lib/mfs/metadata.mfs.empty")  # shipped by moosefs-master
CLIENT_PORT = 9421  # MATOCL: where mfsmount and mfscli reach the master
CHUNKSERVERS = ("c1", "c2")


def _chown_mfs(path):
    """The daemons drop to user mfs: their data and chunk directories must be its own."""
    pw = pwd.getpwnam("mfs")
    for root, dirs, files in os.walk(path):
        for name in [root] + [os.path.join(root, x) for x in dirs + files]:
            os.chown(name, pw.pw_uid, pw.pw_gid)


def _write_cfg(path, settings):
    path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))


def _listening(addr, port):
    try:
        socket.create_connection((addr, port), timeout=1).close()
        return True
    except OSError:
        return False


def _tail(path, n=8):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class MfsDaemon:
    """mfsmaster or mfschunkserver in the foreground in `node`, with config `cfg`."""

    def __init__(self, node, binary, cfg):
        self.node, self.binary, self.cfg = node, binary, cfg
        self.logfile = cfg.parent / f"{binary}.log"
        self.proc = None

    def start(self):
        self.proc = self.node.spawn([self.binary, "-f", "-u", "-c", self.cfg], self.logfile)

    def check_alive(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.binary} on {self.node.name} exited {self.proc.returncode}: "
                               f"{_tail(self.logfile)}")

    def reap(self):
        """After its pid has been signalled and is gone: collect its exit status."""
        self.proc.wait()
        if self.proc.returncode not in (0, -signal.SIGTERM):
            log(f"{self.binary} on {self.node.name} exited {self.proc.returncode}: {_tail(self.logfile, 3)}")
        self.proc = None


def stop_daemons(daemons):
    """SIGTERM the daemons themselves, together, and wait for them (the master writes its metadata out
    as it exits, and its helper processes must not be killed under it), then the rest of their nodes."""
    running = [d for d in daemons if d.proc is not None]
    kill_pids([d.proc.pid for d in running], grace=30)
    for d in running:
        d.reap()
    for d in daemons:
        d.node.stop()


class MooseFS(Deployment):
    """shape "chunks": densefs under each chunkserver's chunk directory; "client": over the mfsmount."""

    def __init__(self, rig, name, densefs, shape):
        super().__init__(rig, name, densefs)
        self.shape = shape
        self.master = None
        self.chunkservers = []
        self.chunk_mounts = []  # (lower, mount point) of densefs under chunk directories
        self.mfs_mnt = self.dir / "mfs"
        self.mfsmount = None
        self.chunks_held = {}  # chunkserver address -> chunks it reported before a stop

    # -- servers

    def _master_cfg(self, node):
        d = self.dir / "master"
        data = d / "data"
        data.mkdir(parents=True)
        shutil.copy(EMPTY_METADATA, data / "metadata.mfs")  # a new file system starts from the empty image
        (d / "mfsexports.cfg").write_text("* / rw,alldirs,admin,maproot=0:0\n* . rw\n")
        (d / "mfstopology.cfg").write_text("")
        _write_cfg(d / "mfsmaster.cfg", {
            "DATA_PATH": data, "EXPORTS_FILENAME": d / "mfsexports.cfg", "TOPOLOGY_FILENAME": d / "mfstopology.cfg",
            "MATOML_LISTEN_HOST": node.addr, "MATOCS_LISTEN_HOST": node.addr, "MATOCL_LISTEN_HOST": node.addr,
            "SYSLOG_IDENT": f"{self.rig.prefix}-mfsmaster"})
        _chown_mfs(d)
        return d / "mfsmaster.cfg"

    def _chunk_dir(self, name):
        """The chunk directory of chunkserver `name`; with densefs under the chunks, mounts densefs."""
        d = self.dir / name
        hdd = d / "chunks"
        if self.densefs and self.shape == "chunks":
            lower = d / "lower"
            self.rig.densefs_mount(lower, hdd)
            self.chunk_mounts.append((lower, hdd))
            self.densefs_lowers.append(lower)
            self.densefs_mounts.append(hdd)
            self.store_dirs.append(lower)
        else:
            hdd.mkdir(parents=True)
            self.store_dirs.append(hdd)
        return hdd

    def _chunkserver_cfg(self, node, hdd):
        d = self.dir / node.name
        (d / "data").mkdir(parents=True, exist_ok=True)
        (d / "mfshdd.cfg").write_text(f"{hdd}\n")
        _write_cfg(d / "mfschunkserver.cfg", {
            "DATA_PATH": d / "data", "HDD_CONF_FILENAME": d / "mfshdd.cfg", "MASTER_HOST": self.master.node.addr,
            "BIND_HOST": node.addr, "CSSERV_LISTEN_HOST": node.addr, "MASTER_RECONNECTION_DELAY": 1,
            "HDD_LEAVE_SPACE_DEFAULT": "64MiB", "SYSLOG_IDENT": f"{self.rig.prefix}-mfs{node.name}"})
        _chown_mfs(d)  # the densefs mount point too: the chunkserver writes there as mfs
        return d / "mfschunkserver.cfg"

    def _start_servers(self):
        self.master.node.start()
        self.master.start()
        wait_for("mfsmaster listening", lambda: self.master.check_alive() or _listening(self.master.node.addr,
                                                                                        CLIENT_PORT), 60)
        for cs in self.chunkservers:
            cs.node.start()
            cs.start()
        wait_for("both chunkservers registered with their chunks", self._chunkservers_ready, 90, 0.5)

    def _chunkservers_ready(self):
        for cs in self.chunkservers:
            cs.check_alive()
        held = self._chunks_by_server()
        if sorted(held) != sorted(cs.node.addr for cs in self.chunkservers):
            return False
        return all(held[a] >= self.chunks_held.get(a, 0) for a in held)

    def _chunks_by_server(self):
        """{chunkserver address: chunks it holds} as the master sees them (`mfscli -SCS`)."""
        p = run(["mfscli", "-H", self.master.node.addr, "-SCS"], check=False, timeout=30)
        held = {}
        for line in p.stdout.splitlines():
            f = line.split("\t")
            # ip, port, id, label, version, load, maintenance, chunks, used space, total space, ...
            if f[0].startswith("chunk servers") and len(f) > 10 and f[8].isdigit() and f[10].isdigit():
                if int(f[10]) > 0:  # its space is known: the master will put new chunks on it
                    held[f[1]] = int(f[8])
        return held

    # -- the client

    def _mount_client(self):
        self.mfs_mnt.mkdir(exist_ok=True)
        with open(self.dir / "mfsmount.log", "ab") as logf:
            self.mfsmount = subprocess.Popen(["mfsmount", "-f", "-H", self.master.node.addr, str(self.mfs_mnt)],
                                             stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        wait_for(f"mfsmount {self.mfs_mnt}", self._client_ready, 60)
        if self.densefs and self.shape == "client":
            self.rig.densefs_mount(self.densefs_lowers[0], self.densefs_mounts[0])

    def _client_ready(self):
        if self.mfsmount.poll() is not None:
            raise RuntimeError(f"mfsmount exited {self.mfsmount.returncode}: {_tail(self.dir / 'mfsmount.log')}")
        return mounted(self.mfs_mnt)

    def _umount_client(self):
        if self.densefs and self.shape == "client":
            self.rig.densefs_umount(self.densefs_mounts[0])
        if self.mfsmount is not None:
            unmount(self.mfs_mnt)
            try:
                self.mfsmount.wait(30)
            except subprocess.TimeoutExpired:
                kill_pids([self.mfsmount.pid])
            self.mfsmount = None

    # -- Deployment

    def setup(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        hdds = [self._chunk_dir(n) for n in CHUNKSERVERS]  # before the nodes: their namespaces see the mounts
        m = self.rig.node("mfsm")
        self.master = MfsDaemon(m, "mfsmaster", self._master_cfg(m))
        self.chunkservers = [MfsDaemon(node, "mfschunkserver", self._chunkserver_cfg(node, hdd))
                             for node, hdd in ((self.rig.node(n), hdd) for n, hdd in zip(CHUNKSERVERS, hdds))]
        self.rig.cleanup.push(f"daemons of {self.label}", self._kill_servers)
        self._start_servers()
        self.rig.cleanup.push(f"mfsmount {self.mfs_mnt}", self._umount_client)
        if self.densefs and self.shape == "client":
            lower = self.mfs_mnt / "dense"
            self.densefs_lowers.append(lower)
            self.densefs_mounts.append(self.dir / "dense")
            self.store_dirs = [cs.cfg.parent / "chunks" for cs in self.chunkservers]
        self._mount_client()
        if self.densefs and self.shape == "client":
            self.client_dir = self.densefs_mounts[0]
        else:
            self.client_dir = self.mfs_mnt

    def _stop_servers(self):
        stop_daemons(self.chunkservers + [self.master])

    def _kill_servers(self):
        """Teardown: the data goes with the directory, so no metadata need be saved (3 s less)."""
        for d in self.chunkservers + [self.master]:
            if d.proc is not None:
                d.proc.kill()
                d.proc.wait()
                d.proc = None
        stop_daemons(self.chunkservers + [self.master])

    def stop(self):
        """Every daemon down: densefs over the client, mfsmount, chunkservers, master, densefs under chunks."""
        self.chunks_held = self._chunks_by_server()
        self._umount_client()
        self._stop_servers()
        self.umount_under(self.chunk_mounts)

    def start(self):
        self.mount_under(self.chunk_mounts)
        self._start_servers()
        self._mount_client()

    def checks(self):
        """MooseFS's own accounting of what the client wrote (item 5) and the ratio on real disks."""
        self._dirinfo_figures()
        self._ratio_figures()

    def _mfs_view(self):
        """Where the client's files appear on MooseFS: densefs's lower, or the mfsmount itself."""
        return self.densefs_lowers[0] if self.densefs and self.shape == "client" else self.mfs_mnt

    def _dirinfo_figures(self):
        """`mfsdirinfo` length/size/realsize (what quotas count) against the logical bytes written."""
        top = self._mfs_view()
        for what, path in (("", top), ("fastq_", top / "reads.fastq"), ("tree_", top / "tree")):
            info = dirinfo(path)
            for k in ("length", "size", "realsize"):
                self.extra[f"mfs_{what}{k}_bytes"] = info[k]
        data = file_bytes(self.client_dir)
        self.extra["data_bytes"] = data
        self.extra["mfs_length_over_data"] = self.extra["mfs_length_bytes"] / max(1, data)
        log(f"{self.label}: mfsdirinfo length {self.extra['mfs_length_bytes']} for {data} bytes of files "
            f"({self.extra['mfs_length_over_data']:.2f}x); FASTQ {self.extra['mfs_fastq_length_bytes']}")

    def _ratio_figures(self):
        """ratio = file bytes x copies / bytes the chunkservers' disks hold. The workload's own ratio
        (logical / allocated on the densefs lowers) misleads on MooseFS: chunk files are padded with
        sparse zeros (their apparent length is about twice the data in the small-file tree), and
        through mfsmount every file counts its whole length, holes included, and directories
        report sizes of megabytes. Kept as `ratio_lowers` where there are densefs lowers."""
        copies = self._goal()
        stored = sum(du_bytes(d) for d in self.store_dirs)
        fastq_stored = self._chunk_bytes(self._mfs_view() / "reads.fastq")
        fastq = os.path.getsize(Path(self.client_dir) / "reads.fastq")
        self.extra.update(copies=copies, ratio=self.extra["data_bytes"] * copies / max(1, stored),
                          fastq_stored_bytes=fastq_stored, fastq_ratio=fastq * copies / max(1, fastq_stored))
        if self.densefs:
            self.extra["ratio_lowers"] = sum(du_bytes(m, apparent=True) for m in self.densefs_mounts) \
                / max(1, sum(du_bytes(d) for d in self.densefs_lowers))
        log(f"{self.label}: {copies} copies, ratio {self.extra['ratio']:.2f} (FASTQ {self.extra['fastq_ratio']:.2f})")

    def _goal(self):
        out = run(["mfsgetgoal", str(self._mfs_view())], timeout=30).stdout
        return int(out.rsplit(":", 1)[1])

    def _chunk_bytes(self, path):
        """Bytes allocated on the chunkservers' disks (densefs's lowers, or the chunk dirs) for the
        chunks of one MooseFS file, all copies."""
        info = run(["mfsfileinfo", str(path)], timeout=60).stdout
        ids = re.findall(r"chunk \d+: ([0-9A-F]{16})_", info)
        files = [p for store in self.store_dirs for cid in ids for p in Path(store).glob(f"*/chunk_{cid}_*.mfs")]
        if not ids or len(files) != len(ids) * self._goal():
            raise RuntimeError(f"{self.label}: {len(files)} chunk files on the chunkservers for {path}, "
                               f"expected {len(ids)} chunks x goal {self._goal()}:\n{info[-600:]}")
        return sum(du_bytes(p) for p in files)


def file_bytes(top):
    """Logical bytes of the regular files under `top`, hard links once (not `du --apparent-size`:
    MooseFS gives directories sizes of megabytes)."""
    seen, total = set(), 0
    for root, _dirs, files in os.walk(top):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def dirinfo(path):
    """`mfsdirinfo PATH` as {inodes, directories, files, chunks, length, size, realsize} (bytes, exact)."""
    info = {}
    for line in run(["mfsdirinfo", "-n", str(path)], timeout=120).stdout.splitlines():
        k, _, v = line.strip().partition(":")
        if v.strip().isdigit():
            info[k.strip()] = int(v)
    return info


def moosefs(rig, densefs):
    return MooseFS(rig, "moosefs", densefs, shape="chunks")


def moosefs_client(rig, densefs):
    return MooseFS(rig, "moosefs-client", densefs, shape="client")


DEPLOYMENTS = {"moosefs": moosefs, "moosefs-client": moosefs_client}
