//! `densefs mount -o ...`: the mount options, parsed into what the daemon is asked for.

use super::owner::Multihost;
use crate::core::atime::Atime;
use crate::core::Options;
use crate::engine::EngineConfig;
use fuser::MountOption;

/// Everything `densefs mount` was asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct MountConfig {
    pub options: Options,
    pub fuse_options: Vec<MountOption>,
    pub allow_other: bool,
    pub threads: usize,
    /// The engine's policy (options set the size window, pre-check and verification).
    pub engine: EngineConfig,
    /// Whether a writable mount keeps an owner record in its lower (owner.rs).
    pub multihost: Multihost,
    /// Whether requests come through io_uring's per-CPU queues instead of /dev/fuse.
    pub io_uring: IoUringMode,
    /// `nodiratime`, shown as the mount's flag (listings never move a directory's atime).
    pub nodiratime: bool,
    /// `metrics=ADDR:PORT`: where the daemon serves Prometheus metrics (checked: loopback
    /// unless `metrics_public`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// `io_uring=auto|on|off`: FUSE over io_uring (Linux 6.14+) serves each request on the CPU its
/// caller runs on. `auto` uses it where the kernel offers it (`enable_uring` is set); `on`
/// refuses to mount without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoUringMode {
    #[default]
    Auto,
    On,
    Off,
}

impl MountConfig {
    /// `ro` and `rw` may both be given (an fstab line, then a command line): the last one counts.
    pub fn read_only(&self) -> bool {
        self.fuse_options.iter().rev().find(|o| matches!(o, MountOption::RO | MountOption::RW)) == Some(&MountOption::RO)
    }
}

/// One mount option besides the properties (each property is a mount option too: the root's
/// default, `core::props::PROPERTIES`): its names, the shape of its value (empty: a flag), a
/// value it accepts (for the tests) and what it does. `densefs mount --help` and
/// densefs-properties(7) are made from this table, and the parser refuses what it does not name.
pub struct MountOptionDoc {
    pub names: &'static [&'static str],
    pub value: &'static str,
    pub example: &'static str,
    pub about: &'static str,
}

/// The mount options that are not properties, in the order help shows them.
pub const MOUNT_OPTIONS: [MountOptionDoc; 25] = [
    MountOptionDoc { names: &["compress"], value: "ALG", example: "zstd-3", about: "The same as compression=." },
    MountOptionDoc {
        names: &["offload_min", "offload_max"],
        value: "SIZE",
        example: "64K",
        about: "Records smaller than offload_min or larger than offload_max are compressed on the CPU (default 4K, 1M).",
    },
    MountOptionDoc {
        names: &["precheck"],
        value: "on|off",
        example: "off",
        about: "Skip slow codecs on data that looks incompressible (an entropy sample and an lz4 try; default on).",
    },
    MountOptionDoc {
        names: &["verify"],
        value: "on|off",
        example: "off",
        about: "Decode every accelerator output on the CPU before storing it (default on).",
    },
    MountOptionDoc {
        names: &["cache_size"],
        value: "SIZE",
        example: "64M",
        about: "File data all open files may hold in memory: written and not yet stored, being compressed, or cached decoded; writers wait for room (at least 8M; default 256M).",
    },
    MountOptionDoc {
        names: &["background_delay"],
        value: "SECONDS",
        example: "1",
        about: "How long a file must stay closed before background_compression re-encodes it, in seconds (or 500ms); a file opened again meanwhile waits that long again (default 500ms).",
    },
    MountOptionDoc {
        names: &["background_rate"],
        value: "SIZE",
        example: "32M",
        about: "The most lower I/O background_compression's pass makes, read and written, per second (0: no bound; default 128M). Its threads also run only when nothing else wants the CPU and the disk, but disks whose scheduler ignores I/O priorities (none, mq-deadline: most SSDs) need the bound.",
    },
    MountOptionDoc {
        names: &["threads"],
        value: "N",
        example: "4",
        about: "FUSE request threads, 1 to 256 (default: the cores, 4 to 16; through io_uring threads / cores per CPU, at least 2).",
    },
    MountOptionDoc {
        names: &["io_uring"],
        value: "auto|on|off",
        example: "off",
        about: "Take requests through FUSE over io_uring (Linux 6.14+), each served on the CPU of the program that made it, instead of through /dev/fuse; on refuses to mount without it (default auto: where the kernel offers it, once /sys/module/fuse/parameters/enable_uring is Y).",
    },
    MountOptionDoc {
        names: &["metrics"],
        value: "ADDR:PORT",
        example: "127.0.0.1:9567",
        about: "Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default): bytes written, stored and read by codec, records by backend and outcome, offload fallbacks, FUSE requests and their latency by operation, memory; densefs metrics MOUNT prints the same. A loopback address only, unless metrics_public is given too.",
    },
    MountOptionDoc {
        names: &["metrics_public"],
        value: "",
        example: "",
        about: "Let metrics= listen on an address other programs on the network can reach.",
    },
    MountOptionDoc {
        names: &["multihost"],
        value: "auto|on|off",
        example: "off",
        about: "Keep an owner record (LOWER/.densefs.owner) with a heartbeat, so that densefs on another machine cannot mount the same lower writable at the same time (default auto: on when the lower is on a network or FUSE file system).",
    },
    MountOptionDoc {
        names: &["relatime"],
        value: "",
        example: "",
        about: "A user's read moves a file's access time when it is not newer than the mtime or ctime or is a day old (the default).",
    },
    MountOptionDoc {
        names: &["strictatime", "norelatime"],
        value: "",
        example: "",
        about: "Every read moves the access time.",
    },
    MountOptionDoc { names: &["noatime"], value: "", example: "", about: "Reads never move access times (ro implies it)." },
    MountOptionDoc { names: &["atime"], value: "", example: "", about: "Undoes noatime (relatime again), as mount(8) does." },
    MountOptionDoc {
        names: &["nodiratime", "diratime"],
        value: "",
        example: "",
        about: "Shown as the mount's flag (listings never move a directory's access time).",
    },
    MountOptionDoc {
        names: &["allow_other", "allow_root"],
        value: "",
        example: "",
        about: "Let other users than the one who mounted it use the mount (default when root; others need user_allow_other in /etc/fuse.conf).",
    },
    MountOptionDoc { names: &["ro", "rw"], value: "", example: "", about: "Mount read-only or read-write (the last one given counts)." },
    MountOptionDoc { names: &["nosuid", "suid"], value: "", example: "", about: "As for any mount (mount(8))." },
    MountOptionDoc { names: &["nodev", "dev"], value: "", example: "", about: "As for any mount (mount(8))." },
    MountOptionDoc { names: &["noexec", "exec"], value: "", example: "", about: "As for any mount (mount(8))." },
    MountOptionDoc { names: &["sync", "async"], value: "", example: "", about: "As for any mount (mount(8))." },
    MountOptionDoc { names: &["dirsync"], value: "", example: "", about: "As for any mount (mount(8))." },
    MountOptionDoc {
        names: &["defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "default_permissions"],
        value: "",
        example: "",
        about: "Accepted for fstab lines (mount(8) reads them); they change nothing in the mount.",
    },
];

/// The row of a mount option that is not a property.
pub fn mount_option(key: &str) -> Option<&'static MountOptionDoc> {
    MOUNT_OPTIONS.iter().find(|o| o.names.contains(&key))
}

fn on_off(key: &str, value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(v) => Err(format!("invalid {key} '{v}' (on or off)")),
    }
}

/// "64K", "16M", "1G" or a plain number of bytes (the one size grammar, core/props.rs).
pub fn parse_size(text: &str) -> Option<u64> {
    crate::core::props::parse_size(text)
}

/// Parses a comma-separated `-o` list (all `-o` arguments joined).
pub fn parse_mount_options(list: &str) -> Result<MountConfig, String> {
    let mut options = Options::default();
    let mut fuse_options = Vec::new();
    let mut nodiratime = false;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let mut allow_other = unsafe { libc::geteuid() } == 0;
    let mut threads = std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(4, 16);
    let mut multihost = Multihost::default();
    let mut io_uring = IoUringMode::default();
    let mut engine = EngineConfig::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let (mut metrics, mut metrics_public) = (None, false);
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        let need = |v: Option<&str>| -> Result<String, String> {
            v.map(str::to_string).ok_or_else(|| format!("mount option '{key}' needs a value ({key}=...)"))
        };
        // Every property is a mount option too, setting the root's default (core/props.rs's table).
        if let Ok(property) = crate::core::props::property(if key == "compress" { "compression" } else { key }) {
            property.parse_into(&need(value)?, &mut options.properties).map_err(|e| format!("{key}: {e}"))?;
            continue;
        }
        if mount_option(key).is_none() {
            return Err(format!("unknown mount option '{item}' (see densefs mount --help or man densefs-properties)"));
        }
        match key {
            "offload_min" | "offload_max" => {
                let v = need(value)?;
                let n = parse_size(&v)
                    .filter(|n| (1..=1 << 20).contains(n))
                    .ok_or_else(|| format!("invalid {key} '{v}' (a size up to 1M, e.g. 4K)"))?;
                if key == "offload_min" {
                    engine.offload_window.0 = n as usize
                } else {
                    engine.offload_window.1 = n as usize
                }
            }
            "cache_size" => {
                let v = need(value)?;
                options.cache_size = parse_size(&v)
                    .filter(|&n| n >= 8 << 20)
                    .ok_or_else(|| format!("invalid cache_size '{v}' (at least 8M, e.g. 256M or 1G)"))?
                    as usize;
            }
            "background_delay" => {
                let v = need(value)?;
                options.background_delay =
                    parse_delay(&v).ok_or_else(|| format!("invalid background_delay '{v}' (seconds up to 86400, e.g. 5 or 500ms)"))?;
            }
            "background_rate" => {
                let v = need(value)?;
                options.background_rate = if v == "0" {
                    0
                } else {
                    parse_size(&v)
                        .filter(|&n| n >= 1 << 20)
                        .ok_or_else(|| format!("invalid background_rate '{v}' (0, or at least 1M, e.g. 64M)"))?
                };
            }
            "precheck" => engine.precheck = on_off(key, value)?,
            "verify" => engine.verify = on_off(key, value)?,
            "threads" => {
                let v = need(value)?;
                threads = v.parse().ok().filter(|n| (1..=256).contains(n)).ok_or_else(|| format!("invalid threads '{v}' (1..256)"))?;
            }
            "multihost" => multihost = Multihost::parse(value)?,
            "metrics" => metrics = Some(need(value)?),
            "metrics_public" => metrics_public = true,
            "io_uring" => {
                io_uring = match value {
                    Some("auto") => IoUringMode::Auto,
                    Some("on") | None => IoUringMode::On,
                    Some("off") => IoUringMode::Off,
                    Some(v) => return Err(format!("invalid io_uring '{v}' (auto, on or off)")),
                }
            }
            "allow_other" => allow_other = true,
            "allow_root" => allow_other = true,
            "ro" => fuse_options.push(MountOption::RO),
            "rw" => fuse_options.push(MountOption::RW),
            "suid" => fuse_options.push(MountOption::Suid),
            "nosuid" => fuse_options.push(MountOption::NoSuid),
            "dev" => fuse_options.push(MountOption::Dev),
            "nodev" => fuse_options.push(MountOption::NoDev),
            "exec" => fuse_options.push(MountOption::Exec),
            "noexec" => fuse_options.push(MountOption::NoExec),
            // As mount(8): `atime` undoes `noatime` (relatime stays the default), `norelatime` is
            // strictatime.
            "atime" if options.atime == Atime::Never => options.atime = Atime::Relative,
            "atime" => {}
            "noatime" => options.atime = Atime::Never,
            "relatime" => options.atime = Atime::Relative,
            "strictatime" | "norelatime" => options.atime = Atime::Strict,
            "nodiratime" => nodiratime = true,
            "diratime" => nodiratime = false,
            "sync" => fuse_options.push(MountOption::Sync),
            "async" => fuse_options.push(MountOption::Async),
            "dirsync" => fuse_options.push(MountOption::DirSync),
            // Accepted for fstab lines; they mean nothing to a FUSE mount.
            "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "users" | "default_permissions" => {}
            _ => unreachable!("BUG: mount option '{key}' is in MOUNT_OPTIONS but not parsed"),
        }
    }
    if engine.offload_window.0 > engine.offload_window.1 {
        return Err("offload_min is larger than offload_max".to_string());
    }
    let metrics = metrics.map(|spec| super::metrics::listen_address(&spec, metrics_public)).transpose()?;
    let mut config = MountConfig { options, fuse_options, allow_other, threads, engine, multihost, io_uring, nodiratime, metrics };
    if config.read_only() {
        config.options.atime = Atime::Never;
    }
    Ok(config)
}

/// Seconds (`5`, `5s`) or milliseconds (`500ms`), at most a day.
fn parse_delay(text: &str) -> Option<std::time::Duration> {
    let (digits, unit_ms) = match text.strip_suffix("ms") {
        Some(ms) => (ms, 1),
        None => (text.strip_suffix('s').unwrap_or(text), 1000),
    };
    let n: u64 = digits.parse().ok()?;
    let ms = n.checked_mul(unit_ms)?;
    (ms <= 86_400_000).then(|| std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{checksum::ChecksumKind, engine::MinSavings};

    #[test]
    fn access_time_options_as_mount_8() {
        let atime = |list: &str| parse_mount_options(list).unwrap().options.atime;
        assert_eq!(atime(""), Atime::Relative);
        assert_eq!(atime("noatime"), Atime::Never);
        assert_eq!(atime("noatime,atime"), Atime::Relative);
        assert_eq!(atime("strictatime"), Atime::Strict);
        assert_eq!(atime("strictatime,atime"), Atime::Strict);
        assert_eq!(atime("norelatime"), Atime::Strict);
        assert_eq!(atime("strictatime,relatime"), Atime::Relative);
        assert_eq!(atime("strictatime,ro"), Atime::Never);
        assert!(parse_mount_options("nodiratime").unwrap().nodiratime);
    }

    #[test]
    fn every_option_in_the_table_is_parsed_and_no_other() {
        for row in &MOUNT_OPTIONS {
            for name in row.names {
                let item = if row.value.is_empty() { name.to_string() } else { format!("{name}={}", row.example) };
                parse_mount_options(&item).unwrap_or_else(|e| panic!("{item}: {e}"));
            }
        }
        for p in &crate::core::props::PROPERTIES {
            assert!(mount_option(p.name).is_none(), "{} is a property and a mount option row", p.name);
        }
        for bogus in ["bogus", "relatimes", "cache", "fsname=x"] {
            assert!(parse_mount_options(bogus).unwrap_err().contains("unknown mount option"), "{bogus}");
        }
    }

    #[test]
    fn io_uring_option() {
        assert_eq!(parse_mount_options("").unwrap().io_uring, IoUringMode::Auto);
        assert_eq!(parse_mount_options("io_uring").unwrap().io_uring, IoUringMode::On);
        assert_eq!(parse_mount_options("io_uring=off").unwrap().io_uring, IoUringMode::Off);
        assert_eq!(parse_mount_options("io_uring=auto").unwrap().io_uring, IoUringMode::Auto);
        assert!(parse_mount_options("io_uring=yes").unwrap_err().contains("auto, on or off"));
    }

    #[test]
    fn options_parse_and_bad_ones_are_explained() {
        let c = parse_mount_options("compression=zstd-3,recordsize=64K,checksum=xxh3,min_savings=20%,ro").unwrap();
        assert_eq!(c.options.properties.compression.to_string(), "zstd-3");
        assert_eq!(c.options.properties.layout.record_size(), 65536);
        assert_eq!(c.options.properties.checksum, ChecksumKind::Xxh3);
        assert_eq!(c.options.properties.min_savings, MinSavings(200));
        assert!(c.fuse_options.contains(&MountOption::RO));
        assert_eq!(parse_mount_options("").unwrap().options, Options::default());
        for bad in ["compression=lz5", "recordsize=3K", "recordsize=2M", "recordsize", "bogus", "threads=0"] {
            let err = parse_mount_options(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12Q"), None);
    }
}
