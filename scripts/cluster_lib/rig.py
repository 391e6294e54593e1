"""The machinery every deployment of `scripts/cluster` shares: server nodes in network namespaces on a
host bridge, daemons started and stopped by pid, densefs mounts, wire byte counters, and one teardown.

How a deployment module plugs in (e.g. `cluster_lib/moosefs.py`):

    from .rig import Deployment

    class MooseFS(Deployment):
        def setup(self):   # first start, in self.dir (emptied before): nodes, daemons, client mount,
                           # all made through self.rig; sets self.client_dir (where the workload writes on
                           # the host), self.store_dirs (where the servers keep the data) and, with densefs,
                           # self.densefs_lowers / self.densefs_mounts (the ratio's allocated / logical bytes)
        def stop(self):    # stop every daemon, the engine's and densefs's, all of them (data kept)
        def start(self):   # start everything again after stop()
        def checks(self):  # optional: checks of its own after the workload; figures into self.extra

    PACKAGES = ["moosefs-master", ...]           # apt-get installed when missing
    DEPLOYMENTS = {"moosefs": lambda rig, densefs: MooseFS(rig, "moosefs", densefs), ...}

`DEPLOYMENTS` maps a name of `scripts/cluster NAME` to a factory `(rig, densefs: bool) -> Deployment`;
the entry point finds every cluster_lib module that has one and runs each name twice, without densefs
(the baseline) and with it. Everything a deployment makes goes through the rig (`rig.node`,
`rig.densefs_mount`, `rig.spawn`, `rig.cleanup.push`), so the rig undoes it after each variant, and on
exit, failure or signal. A client that is not a host directory (NFS through libnfs) overrides
write_file/read_file/copy_tree/tree_view instead of setting client_dir; `rsync_flags` says what the
tree check can compare on that engine.

Nodes: `rig.node("s1", private=["/var/lib/glusterd", "/run"])` makes network namespace PREFIX-s1 with
its own address on the bridge (subnet .2, .3, ...) and a holder process whose private mount namespace
binds a per-node directory over each `private` path (for daemons with fixed paths). `node.run(cmd)`
and `node.spawn(cmd)` run inside both namespaces; `node.stop()` kills every process of the network
namespace, `node.start()` makes a fresh holder. Its mount namespace is a copy of the host's made
then: mount a brick's densefs before rig.node()/node.start(), and stop the node before unmounting it
(a copy keeps a FUSE mount alive). FUSE mounts outside rig.scratch are dropped from the copy.
Addresses: the bridge (the host, where clients run) is .1 of the subnet (a /24), nodes .2, .3, ...
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
sys.dont_write_bytecode = True
import harness as h  # noqa: E402  (run, log, Cleanup, stop_pid, drop_caches, ensure_packages)

log, run, out, drop_caches, ensure_packages = h.log, h.run, h.out, h.drop_caches, h.ensure_packages
MiB = 1 << 20
DEFAULT_SUBNET = "10.77.0.0/24"


class Mismatch(Exception):
    """Data or metadata read back differs from what was written: the run fails."""


# ----------------------------------------------------------------------------- processes and mounts

def mounted(path):
    return h.mounted(path)


def wait_for(what, test, timeout=60, step=0.2):
    """Poll `test` until it returns something true; raise naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = test()
        if r:
            return r
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def kill_pids(pids, grace=10):
    """SIGTERM, then SIGKILL what is left after `grace` seconds; waits until all are gone."""
    pids = [p for p in pids if h.pid_alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while any(h.pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in pids:
        if h.pid_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wait_for("killed processes to go", lambda: not any(h.pid_alive(p) for p in pids), 20)


def unmount(path):
    """Unmount `path` (lazily as a last resort); no error if it is not mounted."""
    h.unmount(str(path))


def mounts_under(root):
    root = os.path.realpath(root) + "/"
    with open("/proc/self/mountinfo") as f:
        found = [line.split()[4] for line in f if line.split()[4].startswith(root)]
    return sorted(found, key=len, reverse=True)


def find_densefs():
    """DENSEFS_BIN, else this checkout's target/release/densefs, else `cargo build --release`."""
    for c in (os.environ.get("DENSEFS_BIN"), REPO / "target" / "release" / "densefs"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    log("no densefs binary: cargo build --release")
    run(["bash", "-c", '[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"; cargo build --release'], cwd=REPO,
        quiet=False, timeout=3600)
    return str(REPO / "target" / "release" / "densefs")


def du_bytes(path, apparent=False):
    """Bytes allocated under `path` (or apparent length), hard links once, as `du` counts them."""
    cmd = ["du", "-s", "-B1"] + (["--apparent-size"] if apparent else []) + [str(path)]
    return int(out(cmd).split()[0])


def iface_bytes(name):
    base = Path("/sys/class/net") / name / "statistics"
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


# ----------------------------------------------------------------------------- nodes

class Node:
    """A server: network namespace PREFIX-NAME, veth to the bridge, a private mount namespace."""

    def __init__(self, rig, name, index, private):
        self.rig, self.name = rig, name
        self.netns = f"{rig.prefix}-{name}"
        self.host_if = f"{rig.prefix}-{name}"[:15]  # its peer in the namespace is eth0
        self.addr = rig.address(index)
        self.dir = rig.scratch / "nodes" / name
        self.private = list(private)
        self.holder = None

    def create(self):
        r = self.rig
        shutil.rmtree(self.dir, ignore_errors=True)  # a fresh node: no state of an earlier one
        r.cleanup.push(f"netns {self.netns}", self.destroy)
        run(["ip", "netns", "add", self.netns])
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.netns])
        run(["ip", "link", "set", self.host_if, "master", r.bridge, "up"])
        for cmd in (["ip", "addr", "add", f"{self.addr}/{r.prefixlen}", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            run(["ip", "netns", "exec", self.netns, *cmd])
        self.start()

    def private_dir(self, path):
        """The host directory bound over `path` inside this node."""
        return self.dir / "private" / path.strip("/").replace("/", "_")

    def start(self):
        """A fresh holder process: joins the netns, binds the private dirs in its own mount namespace."""
        # A mount namespace copies every mount of the host, other runs' FUSE mounts and netns files
        # among them, and would keep them alive after they unmount there: drop all but ours.
        keep = str(self.rig.scratch) + "/"
        binds = ["findmnt -rn -o TARGET,FSTYPE | awk '$2 ~ /^(fuse|nsfs)/ && index($1 \"/\", \"%s\") != 1 "
                 "{print $1}' | sort -r | while read -r m; do umount -l \"$m\"; done" % keep]
        for p in self.private:
            d = self.private_dir(p)
            d.mkdir(parents=True, exist_ok=True)
            os.makedirs(p, exist_ok=True)
            binds.append(f"mount --bind '{d}' '{p}'")
        script = " && ".join(binds + ["echo ready", "exec sleep infinity"])
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "-m", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"node {self.name}: namespace holder failed: {self.holder.stderr.read()[-400:]}")

    def enter(self):
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-m", "--"]

    def run(self, cmd, **kw):
        """Run `cmd` in this node's namespaces (raises with its output on failure)."""
        return run(self.enter() + list(map(str, cmd)), **kw)

    def spawn(self, cmd, logfile):
        """Start a daemon in this node (it stays in the foreground: its pid is the Popen's)."""
        with open(logfile, "ab") as f:
            return subprocess.Popen(self.enter() + list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def pids(self):
        p = run(["ip", "netns", "pids", self.netns], check=False)
        return [int(x) for x in p.stdout.split() if x.isdigit()]

    def stop(self):
        """Kill every process of this node (its daemons, their children, the holder), and empty its
        /run, as a reboot does (it is a tmpfs on a real server)."""
        kill_pids(self.pids())
        if self.holder:
            self.holder.wait()
            self.holder = None
        # A pid file left in /run names a daemon that may still be a zombie: PID 1 here reaps
        # orphans a second or two late, and glusterd takes a brick whose pid file names a zombie
        # for a running one and never starts it.
        if "/run" in self.private:
            run_dir = self.private_dir("/run")
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)

    def destroy(self):
        self.stop()
        run(["ip", "link", "del", self.host_if], check=False)
        run(["ip", "netns", "del", self.netns], check=False)
        self.rig.nodes.pop(self.name, None)


# ----------------------------------------------------------------------------- the rig

class Rig:
    def __init__(self, prefix="dfs", subnet=None, scratch=None, keep=False):
        self.prefix = prefix
        subnet = subnet or os.environ.get("DENSEFS_CLUSTER_SUBNET") or DEFAULT_SUBNET
        net, self.prefixlen = subnet.split("/")
        self.net = net.rsplit(".", 1)[0]
        self.bridge = f"{prefix}-br"[:15]
        self.scratch = Path(scratch or f"/var/tmp/densefs-cluster/{prefix}").resolve()
        self.keep = keep
        self.cleanup = h.Cleanup()
        self.nodes = {}
        self._densefs = None
        self._registered = set()

    def address(self, index):
        return f"{self.net}.{index}"

    @property
    def host_addr(self):
        return self.address(1)

    @property
    def densefs_bin(self):
        if not self._densefs:
            self._densefs = find_densefs()
        return self._densefs

    # -- lifecycle

    def setup(self):
        """Undo what an earlier killed run with this prefix left, then make the bridge."""
        self.clean_stale()
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.cleanup.push(f"bridge {self.bridge}", lambda: run(["ip", "link", "del", self.bridge], check=False))
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.host_addr}/{self.prefixlen}", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])

    def mark(self):
        """A point in the cleanup stack: `teardown_since(mark)` undoes only what came after."""
        return len(self.cleanup.stack)

    def teardown_since(self, mark):
        while len(self.cleanup.stack) > mark:
            self.cleanup._do(*self.cleanup.stack.pop())

    def teardown(self):
        if self.keep:
            log(f"--keep: leaving namespaces {self.prefix}-*, mounts under {self.scratch} and daemons up")
            return
        self.cleanup.all()
        self.nodes = {}

    def clean_stale(self):
        # Clients first, while their servers still answer: a network client (mfsmount) whose
        # servers are gone blocks its unmount, and a densefs over it its write-back, for minutes.
        for m in mounts_under(self.scratch) if self.scratch.exists() else []:
            if run(["umount", m], check=False, timeout=60).returncode == 0:
                log(f"stale mount {m}: unmounted")
        for ns in run(["ip", "netns", "list"], check=False).stdout.split("\n"):
            name = ns.split(" ")[0]
            if name.startswith(f"{self.prefix}-"):
                log(f"stale namespace {name}: removing")
                pids = run(["ip", "netns", "pids", name], check=False).stdout.split()
                kill_pids([int(p) for p in pids if p.isdigit()])
                run(["ip", "netns", "del", name], check=False)
        for m in mounts_under(self.scratch) if self.scratch.exists() else []:
            log(f"stale mount {m}: unmounting")
            unmount(m)
        # veths went with their namespaces; only the bridge is left (other prefixes' links untouched)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            run(["ip", "link", "del", self.bridge], check=False)

    # -- nodes, daemons, mounts

    def node(self, name, private=()):
        """A new server node (see the module docstring); destroyed at teardown."""
        used = {m.addr for m in self.nodes.values()}
        index = next(i for i in range(2, 255) if self.address(i) not in used)
        n = Node(self, name, index, private)
        self.nodes[name] = n
        n.create()
        return n

    def spawn(self, cmd, logfile):
        """A host-side daemon in the foreground (killed at teardown if still alive)."""
        with open(logfile, "ab") as f:
            p = subprocess.Popen(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.cleanup.push(f"pid {p.pid} {cmd[0]}", lambda: kill_pids([p.pid]))
        return p

    def densefs_mount(self, lower, mnt, options="", check=True):
        """`densefs mount LOWER MNT` (the daemon forks); unmounted at teardown. Returns the CompletedProcess."""
        Path(lower).mkdir(parents=True, exist_ok=True)
        Path(mnt).mkdir(parents=True, exist_ok=True)
        opts = ["-o", options] if options else []
        logf = self.scratch / "logs" / (str(mnt).strip("/").replace("/", "_") + ".log")
        logf.parent.mkdir(exist_ok=True)
        p = run([self.densefs_bin, "mount", *opts, "--log", str(logf), str(lower), str(mnt)], check=False)
        if p.returncode == 0:
            if str(mnt) not in self._registered:  # a remount keeps its first place in the cleanup stack
                self._registered.add(str(mnt))
                self.cleanup.push(f"densefs {mnt}", lambda: self.densefs_umount(mnt))
        elif check:
            raise RuntimeError(f"densefs mount {lower} {mnt} exited {p.returncode}: {p.stdout.strip()[-500:]}")
        return p

    def densefs_umount(self, mnt):
        """`densefs umount MNT`: returns once the daemon has written everything back."""
        if mounted(mnt):
            t0 = time.monotonic()
            p = run([self.densefs_bin, "umount", str(mnt)], check=False, timeout=120)
            if time.monotonic() - t0 > 5:
                log(f"densefs umount {mnt} took {time.monotonic() - t0:.1f}s")
            if p.returncode != 0 and mounted(mnt):
                log(f"densefs umount {mnt}: {p.stdout.strip()[-300:]}; unmounting")
                unmount(mnt)

    def wire_bytes(self):
        """Bytes the host sent to and received from the servers (the bridge's own counters: frames
        between the host and the nodes; node-to-node frames are counted by `node_wire_bytes`)."""
        return iface_bytes(self.bridge)

    def node_wire_bytes(self):
        return sum(iface_bytes(n.host_if) for n in self.nodes.values() if Path(f"/sys/class/net/{n.host_if}").exists())


# ----------------------------------------------------------------------------- deployments

class Deployment:
    """One deployment of one engine, with densefs or without (the baseline).

    Subclasses implement setup(), start(), stop() and set `client_dir` (a host directory the workload
    writes to) and, with densefs, `densefs_lowers`. A client that is not a host directory (NFS through
    libnfs) overrides the I/O methods below instead of setting client_dir, and tree_view() to name the
    directory on a server where the written tree can be checked."""
    rsync_flags = "-aHAXn"  # what the tree check compares (an engine without xattrs drops the X)

    def __init__(self, rig, name, densefs):
        self.rig, self.name, self.densefs = rig, name, densefs
        self.label = f"{name} {'densefs' if densefs else 'baseline'}"
        self.dir = rig.scratch / name / ("densefs" if densefs else "plain")
        self.client_dir = None
        self.densefs_lowers = []  # densefs's lower dirs (ratio = logical / allocated there)
        self.densefs_mounts = []  # densefs's mount points (logical bytes)
        self.store_dirs = []  # where the servers keep the data (bricks, chunk dirs): bytes stored
        self.extra = {}  # figures and check results of this deployment's own (e.g. two clients)

    def setup(self):
        raise NotImplementedError

    def start(self):
        raise NotImplementedError

    def stop(self):
        raise NotImplementedError

    def checks(self):
        """Deployment-specific checks run after the workload (e.g. a second client); fill self.extra,
        raise Mismatch on failure."""

    # -- densefs under the engine's storage (bricks, chunk directories)

    def mount_under(self, mounts):
        """densefs on each (lower, mount point) the servers keep their data in."""
        for lower, mnt in mounts:
            self.rig.densefs_mount(lower, mnt)

    def umount_under(self, mounts):
        """Each of them unmounted once the servers are down; one that stays mounted fails the run
        (the restart would not be a restart of densefs)."""
        for _lower, mnt in mounts:
            self.rig.densefs_umount(mnt)
            if mounted(mnt):
                raise RuntimeError(f"{self.label}: densefs under the engine's storage {mnt} is still mounted after stopping")

    # -- I/O the workload uses; a host directory by default

    def write_file(self, src, rel):
        """Copy local file `src` to `rel` on the client and make it durable (fsync)."""
        dst = Path(self.client_dir) / rel
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
            fo.flush()
            os.fsync(fo.fileno())

    def read_file(self, rel, sink):
        """Feed the file's bytes to `sink(chunk)` as read from the client."""
        with open(Path(self.client_dir) / rel, "rb") as f:
            while chunk := f.read(1 << 20):
                sink(chunk)

    def copy_tree(self, tar, rel):
        """Untar `tar` into `rel` on the client (xattrs kept) and sync."""
        dst = Path(self.client_dir) / rel
        dst.mkdir()
        run(["tar", "--xattrs", "--xattrs-include=user.*", "-xpf", str(tar), "-C", str(dst)], timeout=1800)
        run(["sync", "-f", str(dst)])

    def tree_view(self, rel):
        """A host directory showing the tree as stored (for rsync and sha256)."""
        return Path(self.client_dir) / rel
