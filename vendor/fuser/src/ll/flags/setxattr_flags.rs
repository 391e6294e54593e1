use bitflags::bitflags;

bitflags! {
    /// Flags of a SETXATTR request beyond setxattr(2)'s, sent once INIT agreed on
    /// `FUSE_SETXATTR_EXT` (empty otherwise).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SetXattrFlags: u32 {
        /// Setting system.posix_acl_access: the caller is neither in the file's group nor has
        /// CAP_FSETID, so the file loses setgid, as chmod would take it.
        const FUSE_SETXATTR_ACL_KILL_SGID = 1 << 0;
    }
}
