//! The control interface between the `densefs` command and its daemon: every request is an
//! extended attribute in the reserved `user.densefs.` namespace on a path of the mount, so the
//! kernel's permission checks apply and no socket or protocol is needed. One table names them;
//! the daemon dispatches on it (`core/xattr.rs`) and the command line asks through it
//! (`cli/client.rs`), so neither side spells a name.
//!
//! | xattr | access | answer / effect |
//! |---|---|---|
//! | `user.densefs.properties` | read | JSON: the effective properties and their sources |
//! | `user.densefs.report` | read | JSON: properties and statistics of everything below |
//! | `user.densefs.scrub` | read | JSON: as `report`, every record verified, problems listed |
//! | `user.densefs.datasets` | read | JSON: as `report`, with the datasets below |
//! | `user.densefs.engine` | read | JSON: the engine's live counters (the same on every path) |
//! | `user.densefs.unwritten` | read | JSON: retries the files whose close could not write them back; how many are still held in memory only (`densefs umount` asks) |
//! | `user.densefs.recompress` | write (files) | rewrite with `compression=…,recordsize=…,name=…` or the current settings |
//! | `user.densefs.<property>` | read, write (directories), remove | a settable property (`core::props::SETTABLE`): effective value; set; inherit again |

use crate::core::props::{SETTABLE, XATTR_PREFIX};
use crate::core::ReportKind;
use std::ffi::{CString, OsStr};

/// One request the command line can make of the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// A JSON report (read).
    Report(ReportKind),
    /// The engine's live counters as JSON (read).
    Engine,
    /// Retry the files held in memory after a failed close; how many still are, as JSON (read).
    Unwritten,
    /// Rewrite a file (write).
    Recompress,
    /// A settable property, by its name in `core::props::SETTABLE` (read, write, remove).
    Property(&'static str),
}

/// Every request but the properties, with the name after `user.densefs.`.
const REQUESTS: [(Control, &str); 7] = [
    (Control::Report(ReportKind::Properties), "properties"),
    (Control::Report(ReportKind::Stats), "report"),
    (Control::Report(ReportKind::Scrub), "scrub"),
    (Control::Report(ReportKind::Datasets), "datasets"),
    (Control::Engine, "engine"),
    (Control::Unwritten, "unwritten"),
    (Control::Recompress, "recompress"),
];

impl Control {
    pub const PROPERTIES: Control = Control::Report(ReportKind::Properties);
    pub const REPORT: Control = Control::Report(ReportKind::Stats);
    pub const SCRUB: Control = Control::Report(ReportKind::Scrub);
    pub const DATASETS: Control = Control::Report(ReportKind::Datasets);

    /// The request named `key` (the part after `user.densefs.`), if there is one.
    pub fn parse(key: &str) -> Option<Control> {
        REQUESTS.iter().find(|(_, k)| *k == key).map(|(c, _)| *c).or_else(|| Control::property(key))
    }

    /// The settable property `name`, if it is one.
    pub fn property(name: &str) -> Option<Control> {
        SETTABLE.iter().find(|p| **p == name).map(|p| Control::Property(p))
    }

    /// The name after `user.densefs.`.
    pub fn key(self) -> &'static str {
        match self {
            Control::Property(name) => name,
            other => REQUESTS.iter().find(|(c, _)| *c == other).map(|(_, k)| *k).expect("BUG: every request is in REQUESTS"),
        }
    }

    /// The full xattr name, `user.densefs.KEY`.
    pub fn xattr_name(self) -> String {
        format!("{XATTR_PREFIX}{}", self.key())
    }

    /// The full xattr name for the C calls.
    pub fn c_name(self) -> CString {
        CString::new(self.xattr_name()).expect("BUG: no NUL in control names")
    }
}

/// The part after `user.densefs.` of an xattr name in densefs's own namespace (a request or not).
pub fn own_key(name: &OsStr) -> Option<&str> {
    name.to_str().and_then(|n| n.strip_prefix(XATTR_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_round_trips_through_its_name() {
        let all = REQUESTS.iter().map(|(c, _)| *c).chain(SETTABLE.iter().map(|p| Control::Property(p)));
        for c in all {
            assert_eq!(Control::parse(c.key()), Some(c));
            assert_eq!(own_key(OsStr::new(&c.xattr_name())), Some(c.key()));
        }
        assert_eq!(Control::Report(ReportKind::Scrub).xattr_name(), "user.densefs.scrub");
        assert_eq!(Control::property("compression").map(Control::xattr_name).as_deref(), Some("user.densefs.compression"));
        // `props` is where the lower tree keeps a directory's own values, not a request.
        assert_eq!(Control::parse("props"), None);
        assert_eq!(Control::parse("colour"), None);
        assert_eq!(own_key(OsStr::new("user.other")), None);
    }
}
