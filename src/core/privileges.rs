//! What a change of a file's contents (write, truncate, fallocate) takes from its mode, as the
//! kernel's `setattr_should_drop_suidgid` decides for a local file system: from a changer
//! without CAP_FSETID, setuid, and setgid where the group may execute or the changer is not in
//! the file's group. Under FUSE_HANDLE_KILLPRIV_V2 the kernel leaves it to the daemon, which
//! as root would keep both on the lower file.

use super::inodes::Node;
use super::{lower, DenseFs, FsResult};
use libc::{S_ISGID, S_ISUID, S_IXGRP};

/// Who changes a file's contents.
#[derive(Clone, Copy, Debug)]
pub struct Changer {
    pub uid: u32,
    /// The file system gid (the FUSE request's; [`UNKNOWN_ID`] where the kernel sends none:
    /// under FUSE_ALLOW_IDMAP it sends ids only with requests that create an inode).
    pub gid: u32,
    /// The thread, whose /proc status tells its other groups and its capabilities.
    pub pid: u32,
    /// Whether it has CAP_FSETID, where the kernel said (a write's FUSE_WRITE_KILL_SUIDGID
    /// flag); else read from /proc, only for a file with a bit to lose.
    pub fsetid: Option<bool>,
}

/// The id a request carries where the kernel tells none (`FUSE_INVALID_UIDGID`).
pub const UNKNOWN_ID: u32 = u32::MAX;

/// The daemon itself (CAP_FSETID): takes nothing.
impl Default for Changer {
    fn default() -> Changer {
        Changer { uid: 0, gid: 0, pid: 0, fsetid: Some(true) }
    }
}

/// The bits of `mode` a changer without CAP_FSETID takes away; `in_group`: whether it is in
/// the file's group (asked only where that decides).
pub fn bits_to_drop(mode: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut drop = mode & S_ISUID;
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !in_group()) {
        drop |= S_ISGID;
    }
    drop
}

impl DenseFs {
    /// Drops what a change by `changer` takes from `inode`'s mode; whether the mode changed.
    pub(super) fn kill_privileges(&self, inode: &Node, changer: &Changer) -> FsResult<bool> {
        let st = lower::stat_fd(inode.raw_fd())?;
        let mode = st.st_mode & 0o7777;
        if mode & (S_ISUID | S_ISGID) == 0 || changer.fsetid == Some(true) {
            return Ok(false);
        }
        // A thread gone (or of another pid namespace) is judged by its uid alone.
        let credentials = lower::credentials(changer.pid).ok();
        let fsetid = changer.fsetid.unwrap_or_else(|| credentials.as_ref().map_or(changer.uid == 0, |c| c.fsetid));
        if fsetid {
            return Ok(false);
        }
        // Under FUSE_ALLOW_IDMAP the request carries no gid: the thread's own says it (on an
        // idmapped mount, in the caller's ids, so a member by its primary group loses setgid).
        let gid = match changer.gid {
            UNKNOWN_ID => credentials.as_ref().map(|c| c.fsgid),
            gid => Some(gid),
        };
        let in_group = || gid == Some(st.st_gid) || credentials.as_ref().is_some_and(|c| c.groups.contains(&st.st_gid));
        let drop = bits_to_drop(mode, in_group);
        if drop == 0 {
            return Ok(false);
        }
        lower::chmod(&lower::proc_path(inode.raw_fd()), mode & !drop)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setgid_goes_where_the_group_may_execute_or_the_changer_is_outside_it() {
        assert_eq!(bits_to_drop(0o6666, || true), S_ISUID);
        assert_eq!(bits_to_drop(0o6666, || false), S_ISUID | S_ISGID);
        assert_eq!(bits_to_drop(0o6676, || panic!("not asked")), S_ISUID | S_ISGID);
        assert_eq!(bits_to_drop(0o0777, || panic!("not asked")), 0);
    }

    #[test]
    fn a_threads_credentials_are_read() {
        let c = lower::credentials(std::process::id()).unwrap();
        // SAFETY: getgroups with a buffer of the length passed.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        assert_eq!(c.groups.len(), n as usize);
        // SAFETY: setfsgid(-1) changes nothing and returns the current file system gid.
        assert_eq!(c.fsgid, unsafe { libc::setfsgid(u32::MAX) } as u32);
    }
}
