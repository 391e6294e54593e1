//! The manual pages (`densefs man --out DIR`, what scripts/install installs): one per command,
//! each rendered by man(1) without a warning, and densefs-properties(7) with an entry for every
//! property and mount option the code has (the tables in core/props.rs, cli/props.rs and
//! cli/mount_options.rs). No mount needed.

mod common;

use common::BIN;
use std::path::Path;
use std::process::Command;

/// Whether man(1) is here, installing man-db (Debian) if not.
fn have_man() -> bool {
    let have = || Command::new("man").arg("--version").output().is_ok_and(|o| o.status.success());
    if have() {
        return true;
    }
    println!("installing man-db");
    let _ = Command::new("sh")
        .args(["-c", "export DEBIAN_FRONTEND=noninteractive; (apt-get install -y -qq man-db || (apt-get update -qq && apt-get install -y -qq man-db)) >/dev/null 2>&1"])
        .status();
    have()
}

/// A page as man(1) shows it on an 80-column terminal; fails on any warning (groff's included).
fn render(page: &Path) -> String {
    let out = Command::new("man").args(["--warnings", "-l"]).arg(page).env("MANWIDTH", "80").env("LC_ALL", "C.UTF-8").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "man -l {}: {stderr}", page.display());
    String::from_utf8(out.stdout).unwrap()
}

/// Every visible command's page name, below `cmd` (`densefs-bench-engine`).
fn command_pages(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    let name = if prefix.is_empty() { cmd.get_name().to_string() } else { format!("{prefix}-{}", cmd.get_name()) };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        command_pages(sub, &name, out);
    }
    out.push(name);
}

#[test]
fn every_command_has_a_page_and_every_property_and_option_an_entry() {
    if !have_man() {
        println!("SKIPPED: man(1) is missing and man-db cannot be installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).arg("man").arg("--out").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "densefs man: {}", String::from_utf8_lossy(&out.stderr));

    let mut pages = Vec::new();
    command_pages(&densefs::cli::command(), "", &mut pages);
    assert!(pages.len() > 10 && pages.contains(&"densefs-mount".to_string()) && pages.contains(&"densefs-bench-engine".to_string()));
    for name in &pages {
        let page = dir.path().join(format!("{name}.8"));
        assert!(page.exists(), "no page {}", page.display());
        let text = render(&page);
        // NAME says which command, and the page's title is its own.
        assert!(text.lines().next().unwrap().starts_with(&format!("{name}(8)")), "{text}");
        assert!(text.contains("densefs-properties(7)"), "{name}(8) does not point to densefs-properties(7)");
    }
    // The page of the hidden command that writes them is not among them.
    assert!(!dir.path().join("densefs-man.8").exists());

    let mount = render(&dir.path().join("densefs-mount.8"));
    for arg in ["<LOWER>", "<MOUNTPOINT>"] {
        let described = mount.lines().skip_while(|l| *l != "OPTIONS").skip_while(|l| l.trim() != arg).nth(1).unwrap_or("");
        assert!(!described.trim().is_empty(), "{arg} is not described in densefs-mount(8):\n{mount}");
    }

    let props = render(&dir.path().join("densefs-properties.7"));
    // The names of the entries: tags at the section's indentation (7 columns; the text is at 14,
    // or on the tag's line after it), each `NAME`, `NAME=VALUE` or several, comma-separated.
    // A tag too long for a line goes on after its last comma.
    let props_joined = props.replace(",\n       ", ", ");
    let entries: std::collections::HashSet<String> = props_joined
        .lines()
        .filter(|l| l.starts_with("       ") && !l.starts_with("        "))
        .flat_map(|l| {
            let mut items = Vec::new();
            for word in l.split_whitespace() {
                let name = word.trim_end_matches(',');
                items.push(name.split('=').next().unwrap().to_string());
                if !word.ends_with(',') {
                    break;
                }
            }
            items
        })
        .collect();
    let entry = |name: &str| entries.contains(name);
    let mut names: Vec<&str> = densefs::core::props::PROPERTIES.iter().map(|p| p.name).collect();
    names.extend(densefs::cli::props::READ_ONLY.iter().map(|(n, _)| *n));
    names.extend(densefs::cli::mount_options::MOUNT_OPTIONS.iter().flat_map(|o| o.names.iter().copied()));
    assert!(names.len() > 30);
    for name in names {
        assert!(entry(name), "densefs-properties(7) has no entry for {name}:\n{props}");
    }
    // Each entry says what it is: the table's text is on the page.
    for p in &densefs::core::props::PROPERTIES {
        let first_words: String = p.about.split(' ').take(3).collect::<Vec<_>>().join(" ");
        assert!(props.split_whitespace().collect::<Vec<_>>().join(" ").contains(&first_words), "{}: {first_words}", p.name);
    }
}

#[test]
fn mount_help_describes_lower_and_mountpoint() {
    let out = Command::new(BIN).args(["mount", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for arg in ["<LOWER>", "<MOUNTPOINT>"] {
        let described = help.lines().skip_while(|l| l.trim() != arg).nth(1).unwrap_or("");
        assert!(!described.trim().is_empty(), "{arg} is not described:\n{help}");
    }
    // The options come from the tables: every mount option's name is there.
    for o in &densefs::cli::mount_options::MOUNT_OPTIONS {
        for name in o.names {
            assert!(help.contains(name), "{name} is missing from densefs mount --help");
        }
    }
}
