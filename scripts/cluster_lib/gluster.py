"""GlusterFS deployments (Debian glusterfs-server/-client 10.3): two server nodes, each a glusterd in its
own network namespace (its /var/lib/glusterd, /run and /var/log/glusterfs private), the client a
glusterfs FUSE mount on the host.

  gluster          distribute volume of 2 bricks; with densefs each brick is a directory of a densefs
                   mount on its server (the servers compress)
  gluster-replica  the same as replica 2 (the client sends every write to both bricks)
  gluster-client   plain bricks; densefs mounted over the host's glusterfs mount (the client compresses).
                   Also: a second glusterfs mount of the volume in another mount namespace, and a
                   second densefs over the same directory through it, which must be refused (or mount
                   read-only) with a message naming the first one (README "multihost")
"""
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from .rig import Deployment, Mismatch, kill_pids, log, mounted, run, unmount, wait_for

PACKAGES = ["glusterfs-server", "glusterfs-client", "rsync", "attr", "fuse3"]
PRIVATE = ["/var/lib/glusterd", "/run", "/var/log/glusterfs"]


class GlusterClient:
    """A glusterfs FUSE client process mounting VOLUME at `mnt` (optionally inside `prefix_cmd`,
    e.g. another mount namespace)."""

    def __init__(self, server, volume, mnt, logfile, prefix_cmd=()):
        self.server, self.volume, self.mnt, self.logfile = server, volume, Path(mnt), logfile
        self.prefix_cmd = list(prefix_cmd)
        self.proc = None

    def mount(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        cmd = self.prefix_cmd + ["glusterfs", "-N", f"--volfile-server={self.server}", f"--volfile-id={self.volume}",
                                 f"--log-file={self.logfile}", str(self.mnt)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(f"glusterfs client mount {self.mnt} (log {self.logfile})", self._ready, 60)

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"glusterfs client for {self.mnt} exited {self.proc.returncode}: "
                               f"{_tail(self.logfile)}")
        if self.prefix_cmd:  # mounted in another namespace: the process answers through its own view
            return run(self.prefix_cmd + ["stat", "-f", "-c", "%T", str(self.mnt)], check=False).stdout.strip() \
                == "fuseblk"
        return mounted(self.mnt)

    def umount(self):
        if self.proc is None:
            return
        if self.prefix_cmd:
            run(self.prefix_cmd + ["umount", str(self.mnt)], check=False)
        else:
            unmount(self.mnt)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            kill_pids([self.proc.pid])
        self.proc = None


def _tail(path, n=8):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class Gluster(Deployment):
    """shape "brick": densefs under each brick; shape "client": densefs over the client mount."""

    def __init__(self, rig, name, densefs, shape="brick", replica=1):
        super().__init__(rig, name, densefs)
        self.shape, self.replica = shape, replica
        self.volume = re.sub(r"\W", "_", f"{rig.prefix}_{name}")
        self.nodes, self.bricks, self.brick_mounts = [], [], []
        self.client = None

    # -- servers

    def _brick_storage(self, i):
        """The brick directory of server i; with densefs under bricks, mounts densefs first."""
        d = self.dir / f"s{i}"
        if self.densefs and self.shape == "brick":
            lower, mnt = d / "lower", d / "mnt"
            self.rig.densefs_mount(lower, mnt)
            self.densefs_lowers.append(lower)
            self.densefs_mounts.append(mnt)
            self.brick_mounts.append((lower, mnt))
            self.store_dirs.append(lower)
            brick = mnt / "brick"
        else:
            brick = d / "brick"
            self.store_dirs.append(brick)
        brick.mkdir(parents=True, exist_ok=True)
        return brick

    def _glusterds(self):
        """glusterd on every server (all started, then each waited for)."""
        for node in self.nodes:
            (node.private_dir("/run") / "gluster").mkdir(exist_ok=True)  # glusterd makes no pid file dir
            node.spawn(["glusterd", "-N", "-p", "/run/gluster/glusterd.pid",
                        "--log-file=/var/log/glusterfs/glusterd.log"], node.dir / "glusterd.out")
        for node in self.nodes:
            wait_for(f"glusterd on {node.name} (log {node.private_dir('/var/log/glusterfs')}/glusterd.log)",
                     lambda: self.cli(node, "volume", "list", check=False).returncode == 0, 60)

    def cli(self, node, *args, check=True):
        return node.run(["gluster", "--mode=script", *args], check=check, timeout=120)

    def _bricks_online(self):
        x = self.cli(self.nodes[0], "volume", "status", self.volume, "--xml", check=False).stdout
        try:
            nodes = ET.fromstring(x).findall(".//volume/node")
        except ET.ParseError:
            return False
        online = [n for n in nodes if (n.findtext("path") or "").startswith("/") and n.findtext("status") == "1"]
        return len(online) == len(self.bricks)

    def _start_servers(self):
        for n in self.nodes:
            n.start()
        self._glusterds()
        wait_for(f"bricks of {self.volume} online", self._bricks_online, 90, 0.5)

    def _mount_client(self):
        self.client.mount()
        if self.densefs and self.shape == "client":
            self.rig.densefs_mount(self.densefs_lowers[0], self.densefs_mounts[0])

    def setup(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bricks = [self._brick_storage(i) for i in (1, 2)]
        self.nodes = [self.rig.node(f"s{i}", PRIVATE) for i in (1, 2)]  # after the brick mounts: they see them
        self._glusterds()
        s1, s2 = self.nodes
        self.cli(s1, "peer", "probe", s2.addr)
        wait_for("peer s2 connected", lambda: "Connected" in self.cli(s1, "pool", "list", check=False).stdout
                 and "Disconnected" not in self.cli(s1, "pool", "list", check=False).stdout, 60)
        wait_for("peer s1 known to s2", lambda: self.cli(s2, "peer", "status", check=False).stdout.count("Connected") == 1, 60)
        kind = ["replica", str(self.replica)] if self.replica > 1 else []
        bricks = [f"{n.addr}:{b}" for n, b in zip(self.nodes, self.bricks)]
        log(f"{self.label}: peers connected")
        self.cli(s1, "volume", "create", self.volume, *kind, "transport", "tcp", *bricks, "force")
        log(f"{self.label}: volume created")
        self.cli(s1, "volume", "start", self.volume)
        log(f"{self.label}: volume started")
        wait_for(f"bricks of {self.volume} online", self._bricks_online, 90, 0.5)
        log(f"{self.label}: bricks online")
        self.client = GlusterClient(s1.addr, self.volume, self.dir / "client", self.dir / "client.log")
        self.rig.cleanup.push(f"glusterfs client {self.client.mnt}", self.client.umount)
        if self.densefs and self.shape == "client":
            self.client.mount()
            lower = self.client.mnt / "dense"
            lower.mkdir(exist_ok=True)
            self.densefs_lowers.append(lower)
            self.densefs_mounts.append(self.dir / "dense")
            self.rig.densefs_mount(lower, self.densefs_mounts[0])
            self.client_dir = self.densefs_mounts[0]
        else:
            self.client.mount()
            self.client_dir = self.client.mnt
        if self.shape == "client":
            self.store_dirs = list(self.bricks)

    def stop(self):
        """Every daemon down: densefs over the client, the client, glusterd and bricks, densefs under them."""
        if self.densefs and self.shape == "client":
            self.rig.densefs_umount(self.densefs_mounts[0])
        self.client.umount()
        for n in self.nodes:
            n.stop()
        self.umount_under(self.brick_mounts)

    def start(self):
        self.mount_under(self.brick_mounts)
        self._start_servers()
        self._mount_client()

    # -- two clients over one directory (issue item 3)

    def checks(self):
        if self.densefs and self.shape == "client":
            self.extra["second_client"] = self.second_client()

    def second_client(self):
        """A second glusterfs mount in another mount namespace, then `densefs mount` over the same
        directory through it: it must fail naming the first daemon, or mount read-only."""
        holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "infinity"],
                                  start_new_session=True)
        enter = ["nsenter", "-t", str(holder.pid), "-m", "--"]
        second = GlusterClient(self.nodes[0].addr, self.volume, self.dir / "client2", self.dir / "client2.log", enter)
        mnt2 = self.dir / "dense2"
        mnt2.mkdir(exist_ok=True)
        try:
            wait_for("the second namespace", lambda: Path(f"/proc/{holder.pid}/ns/mnt").exists(), 10)
            second.mount()
            lower2 = second.mnt / "dense"
            p = run(enter + [self.rig.densefs_bin, "mount", str(lower2), str(mnt2)], check=False, timeout=60)
            msg = p.stdout.strip()
            ro = False
            if p.returncode == 0:
                opts = run(enter + ["findmnt", "-n", "-o", "OPTIONS", str(mnt2)], check=False).stdout
                ro = "ro" in opts.split(",")
                run(enter + [self.rig.densefs_bin, "umount", str(mnt2)], check=False, timeout=90)
            r = {"exit": p.returncode, "message": msg[:600], "read_only": ro}
            log(f"second densefs over the same Gluster directory: exit {p.returncode}, read-only {ro}: {msg[:600]}")
            if p.returncode == 0 and not ro:
                raise Mismatch(f"{self.label}: a second densefs mounted the same Gluster directory writable "
                               f"from another client (it must refuse or mount read-only)")
            if p.returncode != 0 and not self._names_holder(msg):
                raise Mismatch(f"{self.label}: the second densefs mount was refused, but its message does not "
                               f"name the holder: {msg[-300:]}")
            return r
        finally:
            second.umount()
            kill_pids([holder.pid])
            holder.wait()

    def _names_holder(self, msg):
        """The refusal names the first daemon: its mount point or its pid."""
        first = str(self.densefs_mounts[0])
        pids = run(["pgrep", "-f", f"densefs.*{first}"], check=False).stdout.split()
        return first in msg or any(re.search(rf"\b{p}\b", msg) for p in pids)


def gluster(rig, densefs):
    return Gluster(rig, "gluster", densefs)


def gluster_replica(rig, densefs):
    return Gluster(rig, "gluster-replica", densefs, replica=2)


def gluster_client(rig, densefs):
    return Gluster(rig, "gluster-client", densefs, shape="client")


DEPLOYMENTS = {"gluster": gluster, "gluster-replica": gluster_replica, "gluster-client": gluster_client}
