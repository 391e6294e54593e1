//! How the commands print: sizes and ratios as ZFS shows them, aligned or scripted tables.

use serde_json::Value;
use std::path::PathBuf;

/// "1 file", "2 files".
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
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

/// A size for a table: exact with `-p` (parsable), else as ZFS prints it.
pub fn size(bytes: u64, parsable: bool) -> String {
    if parsable {
        bytes.to_string()
    } else {
        human(bytes)
    }
}

/// logical / physical, as ZFS's `compressratio` (1.00x when nothing is stored).
pub fn ratio(stats: &Value) -> f64 {
    let logical = stats["logicalused"].as_u64().unwrap_or(0) as f64;
    let used = stats["used"].as_u64().unwrap_or(0) as f64;
    if used == 0.0 || logical == 0.0 {
        1.0
    } else {
        logical / used
    }
}

/// A mount-relative path from a report, shown as a full path.
pub fn full_path(mount: &Option<PathBuf>, rel: &str) -> String {
    match mount {
        Some(m) if rel == "/" => m.display().to_string(),
        Some(m) => m.join(rel.trim_start_matches('/')).display().to_string(),
        None => rel.to_string(),
    }
}

/// Rows under a header, columns aligned; `scripted`: no header, tab-separated.
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
            if i + 1 == cells.len() {
                out.push_str(c)
            } else {
                out.push_str(&format!("{c:<w$}  "))
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
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
