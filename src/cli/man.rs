//! `densefs man --out DIR` (hidden; scripts/install runs it): the manual pages, made from the
//! clap tree and the tables, so that they say what the code does. densefs(8) and one page per
//! command (densefs-mount(8), ..., as git and zfs have them) come from clap_mangen;
//! densefs-properties(7) (as zfsprops(7)) lists every property (`core::props::PROPERTIES` and
//! `props::READ_ONLY`) and every mount option (`mount_options::MOUNT_OPTIONS`).

use super::mount_options::MOUNT_OPTIONS;
use super::props::READ_ONLY;
use crate::core::props::{PropertyValues, PROPERTIES};
use roff::{bold, italic, roman, Roff};
use std::path::Path;

/// Writes every page into `dir` (created if missing).
pub fn write_pages(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = super::command().disable_help_subcommand(true).mut_subcommand("mount", |mount| {
        // The options block of `densefs mount --help` is densefs-properties(7), laid out for a page.
        let about = mount.get_long_about().map(|a| a.to_string()).unwrap_or_default();
        match (about.find("Options (-o"), about.find("These are the root")) {
            (Some(start), Some(end)) => {
                let options = "Options (-o, comma-separated, repeatable): the properties and mount options that \
                               densefs-properties(7) lists.\n\n";
                let about = format!("{}{options}{}", &about[..start], &about[end..]);
                mount.long_about(about)
            }
            _ => mount,
        }
    });
    cmd.build();
    let mut written = Vec::new();
    command_pages(&cmd, dir, &mut written)?;
    let path = dir.join("densefs-properties.7");
    std::fs::write(&path, properties_page()).map_err(|e| format!("{}: {e}", path.display()))?;
    written.push(path);
    for p in written {
        println!("{}", p.display());
    }
    Ok(())
}

/// The page of `cmd` and of each visible command below it, in section 8.
fn command_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<std::path::PathBuf>) -> Result<(), String> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_pages(sub, dir, written)?;
    }
    let man = clap_mangen::Man::new(cmd.clone()).section("8").manual("densefs").source(format!("densefs {}", env!("CARGO_PKG_VERSION")));
    let mut page = Vec::new();
    man.render(&mut page).map_err(|e| e.to_string())?;
    let mut see_also = Roff::new();
    see_also.control("SH", ["SEE ALSO"]);
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let mut refs: Vec<String> = Vec::new();
    if name != "densefs" {
        refs.push("densefs(8)".into());
    }
    refs.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| format!("{}(8)", s.get_display_name().unwrap_or(s.get_name()))));
    refs.push("densefs-properties(7)".into());
    if matches!(cmd.get_name(), "mount" | "umount") {
        refs.extend(["mount(8)".into(), "fstab(5)".into(), "fusermount3(1)".into()]);
    }
    see_also.text([roman(refs.join(", "))]);
    page.extend_from_slice(see_also.render().as_bytes());
    let path = dir.join(man.get_filename());
    std::fs::write(&path, page).map_err(|e| format!("{}: {e}", path.display()))?;
    written.push(path);
    Ok(())
}

/// densefs-properties(7): every property and mount option, from the tables.
pub fn properties_page() -> String {
    let defaults = PropertyValues::default();
    let mut r = Roff::new();
    r.control("TH", ["DENSEFS-PROPERTIES", "7", "", &format!("densefs {}", env!("CARGO_PKG_VERSION")), "densefs"]);
    // Names are not hyphenated: each entry's tag reads as the option is typed.
    r.control("nh", []);
    r.control("SH", ["NAME"]);
    r.text([roman("densefs-properties - properties and mount options of densefs file systems")]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "Directories of a densefs mount carry properties, as ZFS datasets do: a new file takes the value of each from the \
         nearest directory above it that sets one (densefs set, densefs inherit), and the root's values are the mount \
         options. A file keeps the compression and record size it was written with; densefs recompress rewrites it. \
         densefs get shows the values in effect, where each comes from, and the read-only properties below.",
    )]);
    r.control("SH", ["SETTABLE PROPERTIES"]);
    r.text([roman("Each is also a mount option (-o NAME=VALUE), which sets the root directory's default.")]);
    for p in &PROPERTIES {
        r.control("TP", []);
        r.text([bold(p.name), roman("="), italic(p.value)]);
        r.text([roman(format!("{} Default: {}.", super::fill_help(p.about), (p.show)(&defaults)))]);
    }
    r.control("SH", ["READ-ONLY PROPERTIES"]);
    r.text([roman("Statistics of a file, or of everything below a directory, computed from the lower files.")]);
    for (name, about) in &READ_ONLY {
        r.control("TP", []);
        r.text([bold(*name)]);
        r.text([roman(*about)]);
    }
    r.control("SH", ["MOUNT OPTIONS"]);
    r.text([roman(
        "densefs mount -o, mount -t densefs -o and fstab lines take the settable properties above and these, \
         comma-separated. densefs's own options cannot change on a live mount (mount -o remount changes only the \
         kernel's flags: ro, rw, nosuid, nodev, noexec, sync, dirsync).",
    )]);
    for o in &MOUNT_OPTIONS {
        r.control("TP", []);
        let mut names = Vec::new();
        for (i, n) in o.names.iter().enumerate() {
            if i > 0 {
                names.push(roman(", "));
            }
            names.push(bold(*n));
            if !o.value.is_empty() {
                names.push(roman("="));
                names.push(italic(o.value));
            }
        }
        r.text(names);
        r.text([roman(o.about)]);
    }
    r.control("SH", ["EXAMPLES"]);
    r.control("nf", []);
    r.text([roman("densefs mount -o compression=zstd-3,recordsize=1M /data/lower /data/mnt")]);
    r.text([roman("densefs set compression=gzip-9 /data/mnt/archive")]);
    r.text([roman("densefs get compression,compressratio,used /data/mnt/archive")]);
    r.text([roman("/data/lower  /data/mnt  densefs  compression=lz4,nofail  0 0     (an /etc/fstab line)")]);
    r.control("fi", []);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman("densefs(8), densefs-mount(8), densefs-set(8), densefs-get(8), densefs-recompress(8), mount(8), fstab(5), zfsprops(7)")]);
    r.render()
}
