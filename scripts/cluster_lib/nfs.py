"""nfs: nfs-ganesha 4.3 (VFS back end) in a server namespace exporting a densefs mount (baseline: a plain
directory), over NFSv3 to a userspace client on the host (this kernel has no NFS client or server).

The client is libnfs (Debian libnfs13 / libnfs-utils 4.0): the FASTQ goes in with `nfs-cp` and comes
back with `nfs-cat`; the small-file tree goes in through libnfs's own calls (mkdir, create/write,
symlink, link, chmod, utimes: NfsTree below, as the tools have no mkdir), so directories, links, modes
and times cross the wire. NFSv3 carries no extended attributes or ACLs, so the tree is checked on the
server side (the exported directory) with `rsync -aHn` and sha256; user.* xattrs are not compared.
ganesha registers with an rpcbind of its node (libnfs finds the ports through it).

ganesha runs with its default descriptor cache: it keeps a descriptor open on every file it wrote,
up to 90% of its limit. densefs spends one descriptor per open file (the inode's is the lower file's),
so the full tree (11.6k files held open) fits under one RLIMIT_NOFILE of 20000 for both.
"""
import ctypes
import os
import stat
import subprocess
from pathlib import Path

from .rig import Deployment, Mismatch, log, run, wait_for

PACKAGES = ["nfs-ganesha", "nfs-ganesha-vfs", "libnfs-utils", "rpcbind", "rsync", "fuse3"]
PRIVATE = ["/run", "/var/lib/nfs", "/var/log/ganesha"]
CONF = """NFS_CORE_PARAM {{
    Protocols = 3;
    Bind_addr = {addr};
    Enable_NLM = false;
    Enable_RQUOTA = false;
}}
NFSv4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = "{recovery}";
}}
EXPORT {{
    Export_Id = 1;
    Path = "{path}";
    Pseudo = "/export";
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = EVENT; }}
"""


class timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class NfsTree:
    """A libnfs (NFSv3) session that copies a local tree to the server: what a `cp -a` over an NFS
    mount would send, without a kernel client."""

    def __init__(self, server, export):
        lib = ctypes.CDLL("libnfs.so.13")
        lib.nfs_init_context.restype = ctypes.c_void_p
        lib.nfs_get_error.restype = ctypes.c_char_p
        self.lib = lib
        self.ctx = ctypes.c_void_p(lib.nfs_init_context())
        if not self.ctx:
            raise RuntimeError("libnfs: nfs_init_context failed")
        self.call("nfs_mount", server.encode(), export.encode())

    def call(self, fn, *args):
        r = getattr(self.lib, fn)(self.ctx, *args)
        if r < 0:
            raise RuntimeError(f"libnfs {fn}{tuple(a for a in args if isinstance(a, bytes))}: "
                               f"{self.lib.nfs_get_error(self.ctx).decode(errors='replace')}")
        return r

    def close(self):
        self.lib.nfs_umount(self.ctx)
        self.lib.nfs_destroy_context(self.ctx)

    def put_file(self, src, dst, mode):
        fh = ctypes.c_void_p()
        self.call("nfs_create", dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, ctypes.byref(fh))
        try:
            with open(src, "rb") as f:
                while chunk := f.read(128 << 10):
                    done = 0
                    while done < len(chunk):  # libnfs 4.0: nfs_write(nfs, fh, count, buf)
                        part = chunk[done:]
                        done += self.call("nfs_write", fh, ctypes.c_uint64(len(part)), part)
        finally:
            self.call("nfs_close", fh)

    def set_meta(self, path, st, link=False):
        times = (timeval * 2)(timeval(int(st.st_atime), 0), timeval(int(st.st_mtime), st.st_mtime_ns // 1000 % 1000000))
        self.call("nfs_lchown", path, st.st_uid, st.st_gid)
        if not link:
            self.call("nfs_chmod", path, stat.S_IMODE(st.st_mode))
        self.call("nfs_lutimes" if link else "nfs_utimes", path, times)

    def copy_tree(self, src, dst):
        """Directories, files, symlinks and hard links with owners, modes and times (dirs' last)."""
        src = Path(src)
        seen, dirs = {}, []
        for root, dnames, fnames in os.walk(src):
            dnames.sort()
            rel = "/" + str(Path(root).relative_to(src)) if Path(root) != src else ""
            here = f"{dst}{rel}".encode()
            self.call("nfs_mkdir2", here, 0o755)
            dirs.append((here, os.stat(root)))
            links = [d for d in dnames if os.path.islink(os.path.join(root, d))]  # os.walk lists them as dirs
            dnames[:] = [d for d in dnames if d not in links]
            for name in sorted(fnames + links):
                p, target = Path(root) / name, here + b"/" + os.fsencode(name)
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    self.call("nfs_symlink", os.fsencode(os.readlink(p)), target)
                    self.set_meta(target, st, link=True)
                elif st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                    self.call("nfs_link", seen[(st.st_dev, st.st_ino)], target)
                else:
                    self.put_file(p, target, stat.S_IMODE(st.st_mode))
                    self.set_meta(target, st)
                    seen[(st.st_dev, st.st_ino)] = target
        for d, st in reversed(dirs):  # children first: their creation changed the parent's mtime
            self.set_meta(d, st)


class Nfs(Deployment):
    # NFSv3 carries no xattrs or ACLs; a symlink's times are not set through ganesha's VFS back end
    # (SETATTR on a symlink succeeds and changes nothing, baseline alike): -J leaves them out
    rsync_flags = "-aHnJ"

    def __init__(self, rig, densefs):
        super().__init__(rig, "nfs", densefs)
        self.node = None

    @property
    def export(self):
        return self.densefs_mounts[0] if self.densefs else self.dir / "export"

    def url(self, rel):
        return f"nfs://{self.node.addr}{self.export}/{rel}"

    def _mount_densefs(self):
        if self.densefs:
            self.rig.densefs_mount(self.densefs_lowers[0], self.densefs_mounts[0])

    def _ganesha(self):
        n = self.node
        (n.private_dir("/run") / "rpcbind").mkdir(exist_ok=True)
        n.spawn(["rpcbind", "-f", "-w"], n.dir / "rpcbind.out")
        wait_for("rpcbind in the server namespace", lambda: n.run(["rpcinfo", "-p", "127.0.0.1"], check=False)
                 .returncode == 0, 30)
        conf = n.dir / "ganesha.conf"
        conf.write_text(CONF.format(addr=n.addr, recovery=n.dir / "recovery", path=self.export))
        (n.dir / "recovery").mkdir(exist_ok=True)
        n.spawn(["ganesha.nfsd", "-F", "-f", conf, "-L", n.dir / "ganesha.log", "-p", n.dir / "ganesha.pid",
                 "-N", "NIV_EVENT"], n.dir / "ganesha.out")
        wait_for(f"ganesha's export (log {n.dir / 'ganesha.log'})", self._exported, 60, 0.3)

    def _exported(self):
        p = run(["timeout", "10", "nfs-ls", f"nfs://{self.node.addr}{self.export}/"], check=False)
        return p.returncode == 0

    def setup(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.densefs:
            self.densefs_lowers.append(self.dir / "lower")
            self.densefs_mounts.append(self.dir / "mnt")
            self._mount_densefs()
            self.store_dirs = list(self.densefs_lowers)
        else:
            self.export.mkdir()
            self.store_dirs = [self.export]
        self.node = self.rig.node("nfs1", PRIVATE)
        self._ganesha()

    def stop(self):
        self.node.stop()
        if self.densefs:
            self.rig.densefs_umount(self.densefs_mounts[0])

    def start(self):
        self._mount_densefs()
        self.node.start()
        self._ganesha()

    # -- I/O through libnfs

    def _tool(self, args, **kw):
        p = subprocess.run(["timeout", "300", *args], **kw)
        if p.returncode != 0:
            raise Mismatch(f"{self.label}: {' '.join(args)} exited {p.returncode}: "
                           f"{(p.stderr or b'').decode(errors='replace')[-300:]}")
        return p

    def write_file(self, src, rel):
        self._tool(["nfs-cp", str(src), self.url(rel)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def read_file(self, rel, sink):
        p = subprocess.Popen(["timeout", "300", "nfs-cat", self.url(rel)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        while chunk := p.stdout.read(1 << 20):
            sink(chunk)
        err = p.stderr.read()
        if p.wait() != 0:
            raise Mismatch(f"{self.label}: nfs-cat {self.url(rel)} exited {p.returncode}: {err.decode()[-300:]}")

    def copy_tree(self, tar, rel):
        """The tree (the tar's source directory) through libnfs calls; `tar` itself cannot run on NFS
        without a kernel client."""
        src = Path(str(tar)[:-len(".tar")])
        client = NfsTree(self.node.addr, str(self.export))
        try:
            client.copy_tree(src, f"/{rel}")
        finally:
            client.close()
        log(f"{self.label}: tree copied through libnfs (user.* xattrs do not cross NFSv3)")

    def tree_view(self, rel):
        return self.export / rel


DEPLOYMENTS = {"nfs": Nfs}
