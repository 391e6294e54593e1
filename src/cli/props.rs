//! `densefs set/inherit/get/list/stat/scrub`: the commands that look at and change a mounted
//! densefs through its paths. They talk to the daemon with extended attributes in the
//! `user.densefs.` namespace (see core/xattr.rs), so they work for any user the mount lets in.

use crate::control::Control;
use crate::core::props::{LocalProps, SETTABLE};
use serde_json::Value;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: bad path", p.display()))
}

fn os_error(path: &Path, what: &str) -> String {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOTSUP) | Some(libc::ENODATA) => format!("{}: not on a densefs mount", path.display()),
        _ => format!("{}: {what}: {e}", path.display()),
    }
}

fn get_xattr(path: &Path, what: Control) -> Result<Vec<u8>, String> {
    let p = cpath(path)?;
    let name = what.c_name();
    loop {
        let n = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(os_error(path, "cannot ask densefs"));
        }
        let mut buf = vec![0u8; n as usize];
        let m = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
        if m >= 0 {
            buf.truncate(m as usize);
            return Ok(buf);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return Err(os_error(path, "cannot ask densefs"));
        }
    }
}

/// The daemon's JSON answer to a read request on a path (a report or the engine's counters).
pub fn report(path: &Path, what: Control) -> Result<Value, String> {
    let bytes = get_xattr(path, what)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: unreadable report from densefs: {e}", path.display()))
}

/// `densefs set PROP=VALUE... DIR`
pub fn set(assignments: &[String], dir: &Path) -> Result<(), String> {
    let p = cpath(dir)?;
    require_densefs(dir)?;
    for a in assignments {
        let (name, value) = a.split_once('=').ok_or_else(|| format!("'{a}': expected PROPERTY=VALUE"))?;
        // Check here too, for a message better than EINVAL.
        LocalProps::default().set(name, value)?;
        let property = Control::property(name).ok_or_else(|| format!("'{name}' is not a settable property"))?;
        if !dir.is_dir() {
            return Err(format!("{}: properties are set on directories", dir.display()));
        }
        let r = unsafe { libc::setxattr(p.as_ptr(), property.c_name().as_ptr(), value.as_ptr() as *const libc::c_void, value.len(), 0) };
        if r != 0 {
            return Err(os_error(dir, &format!("cannot set {name}")));
        }
    }
    Ok(())
}

/// `densefs inherit PROP DIR`
pub fn inherit(name: &str, dir: &Path) -> Result<(), String> {
    let Some(property) = Control::property(name) else {
        return Err(format!("'{name}' cannot be inherited (settable: {})", SETTABLE.join(", ")));
    };
    let p = cpath(dir)?;
    require_densefs(dir)?;
    let r = unsafe { libc::removexattr(p.as_ptr(), property.c_name().as_ptr()) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENODATA) {
        return Err(os_error(dir, &format!("cannot inherit {name}")));
    }
    Ok(())
}

/// Sizes as ZFS prints them: 512B, 12.5K, 1.21G.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else if v >= 100.0 {
        format!("{v:.0}{}", UNITS[unit])
    } else if v >= 10.0 {
        format!("{v:.1}{}", UNITS[unit])
    } else {
        format!("{v:.2}{}", UNITS[unit])
    }
}

/// logical / physical, as ZFS's `compressratio` (1.00x when nothing is stored).
pub fn ratio(stats: &Value) -> f64 {
    let logical = stats["logicalused"].as_u64().unwrap_or(0) as f64;
    let used = stats["used"].as_u64().unwrap_or(0) as f64;
    if used == 0.0 || logical == 0.0 { 1.0 } else { logical / used }
}

/// The mount point of the densefs mount holding `path`, if any.
pub fn mountpoint_of(path: &Path) -> Option<PathBuf> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = super::mount::mountinfo();
    // The deepest mount point above the path; densefs only if the top mount there is.
    let point = mounts.iter().filter(|m| path.starts_with(&m.point)).map(|m| &m.point).max_by_key(|p| p.as_os_str().len())?;
    mounts.iter().rev().find(|m| &m.point == point).filter(|m| m.is_densefs()).map(|m| m.point.clone())
}

/// Refuses paths outside densefs mounts (else `set` would quietly write a plain user xattr).
fn require_densefs(path: &Path) -> Result<(), String> {
    std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if mountpoint_of(path).is_none() {
        return Err(format!("{}: not on a densefs mount (see `densefs list` for the mounts)", path.display()));
    }
    Ok(())
}

/// A mount-relative path from a report, shown as a full path.
fn full_path(mount: &Option<PathBuf>, rel: &str) -> String {
    match mount {
        Some(m) if rel == "/" => m.display().to_string(),
        Some(m) => m.join(rel.trim_start_matches('/')).display().to_string(),
        None => rel.to_string(),
    }
}

pub struct Row {
    pub name: String,
    pub property: String,
    pub value: String,
    pub source: String,
}

/// The (property, value, source) rows `densefs get` shows for one path.
pub fn property_rows(path: &Path, report: &Value, parsable: bool) -> Vec<Row> {
    let mount = mountpoint_of(path);
    let name = path.display().to_string();
    let mut rows = Vec::new();
    let mut push = |property: &str, value: String, source: String| {
        rows.push(Row { name: name.clone(), property: property.to_string(), value, source })
    };
    if let Some(props) = report["properties"].as_object() {
        for p in SETTABLE {
            if let Some(entry) = props.get(p) {
                let source = entry["source"].as_str().unwrap_or("-");
                let source = match source.strip_prefix("inherited from ") {
                    Some(rel) => format!("inherited from {}", full_path(&mount, rel)),
                    None => source.to_string(),
                };
                push(p, entry["value"].as_str().unwrap_or("-").to_string(), source);
            }
        }
    }
    let stats = &report["stats"];
    let size = |key: &str| {
        let n = stats[key].as_u64().unwrap_or(0);
        if parsable { n.to_string() } else { human(n) }
    };
    let r = ratio(stats);
    push("compressratio", if parsable { format!("{r:.2}") } else { format!("{r:.2}x") }, "-".into());
    push("used", size("used"), "-".into());
    push("logicalused", size("logicalused"), "-".into());
    push("written", size("written"), "-".into());
    if let Some(records) = stats["records"].as_object() {
        for (alg, n) in records {
            push(&format!("records_{alg}"), n.to_string(), "-".into());
        }
    }
    push("records_raw_low_savings", stats["raw_low_savings"].as_u64().unwrap_or(0).to_string(), "-".into());
    rows
}

/// The engine's counters as read-only `engine.*` properties of a mount (they cover the whole
/// mount, whichever path is asked about).
pub fn engine_rows(snapshot: &Value, parsable: bool) -> Vec<(String, String)> {
    let size = |n: u64| if parsable { n.to_string() } else { human(n) };
    let mut rows = Vec::new();
    let states: Vec<String> = snapshot["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| format!("{}({})", b["name"].as_str().unwrap_or("?"), b["state"].as_str().unwrap_or("?")))
        .collect();
    rows.push(("engine.backends".to_string(), states.join(",")));
    for b in snapshot["backends"].as_array().into_iter().flatten() {
        let name = b["name"].as_str().unwrap_or("?");
        for op in ["compress", "decompress"] {
            for (alg, c) in b[op].as_object().into_iter().flatten() {
                let n = |k: &str| c[k].as_u64().unwrap_or(0);
                let prefix = format!("engine.{name}.{op}.{alg}");
                rows.push((format!("{prefix}.records"), n("records").to_string()));
                rows.push((format!("{prefix}.bytes_in"), size(n("bytes_in"))));
                rows.push((format!("{prefix}.bytes_out"), size(n("bytes_out"))));
            }
        }
        rows.push((format!("engine.{name}.busy"), format!("{:.1}s", b["busy_s"].as_f64().unwrap_or(0.0))));
        if name != "cpu" {
            rows.push((format!("engine.{name}.errors"), b["errors"].as_u64().unwrap_or(0).to_string()));
            rows.push((format!("engine.{name}.resets"), b["resets"].as_u64().unwrap_or(0).to_string()));
        }
    }
    for (why, n) in snapshot["fallbacks"].as_object().into_iter().flatten() {
        rows.push((format!("engine.fallbacks.{why}"), n.as_u64().unwrap_or(0).to_string()));
    }
    for (what, n) in snapshot["records"].as_object().into_iter().flatten() {
        let n = n.as_u64().unwrap_or(0);
        rows.push((format!("engine.{what}"), if what.ends_with("bytes") { size(n) } else { n.to_string() }));
    }
    for (alg, n) in snapshot["auto"].as_object().into_iter().flatten() {
        rows.push((format!("engine.auto.{alg}"), n.as_u64().unwrap_or(0).to_string()));
    }
    rows
}

pub fn print_table(header: &[&str], rows: &[Vec<String>], scripted: bool) {
    if scripted {
        for r in rows {
            println!("{}", r.join("\t"));
        }
        return;
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() { out.push_str(c) } else { out.push_str(&format!("{c:<w$}  ")) }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// Every regular file at or below `path` (recursing only with `recursive`), symlinks not followed.
pub fn files_below(path: &Path, recursive: bool) -> Result<Vec<(PathBuf, u64)>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_file() {
        return Ok(vec![(path.to_path_buf(), meta.len())]);
    }
    if !meta.is_dir() {
        return Err(format!("{}: not a regular file or directory", path.display()));
    }
    if !recursive {
        return Err(format!("{}: is a directory (use -r)", path.display()));
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((entry.path(), len));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Asks the daemon to rewrite one file (`spec`: "" or "compression=…,recordsize=…").
pub fn recompress_file(file: &Path, spec: &str) -> Result<(), String> {
    let p = cpath(file)?;
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let spec = if name.contains(',') { spec.to_string() } else if spec.is_empty() { format!("name={name}") } else { format!("{spec},name={name}") };
    let r = unsafe { libc::setxattr(p.as_ptr(), Control::Recompress.c_name().as_ptr(), spec.as_ptr() as *const libc::c_void, spec.len(), 0) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EBUSY) => "open elsewhere; close it and run again to change its record size or convert it".to_string(),
        Some(libc::EMLINK) => "hard-linked; left as it is".to_string(),
        Some(libc::ENOTSUP) => "not on a densefs mount".to_string(),
        _ => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_like_zfs() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(12_800), "12.5K");
        assert_eq!(human(1_300_000_000), "1.21G");
        assert_eq!(human(200 << 20), "200M");
        assert_eq!(ratio(&serde_json::json!({"logicalused": 300, "used": 100})), 3.0);
        assert_eq!(ratio(&serde_json::json!({"logicalused": 0, "used": 0})), 1.0);
    }
}
