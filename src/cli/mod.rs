//! The `densefs` command line.

pub mod iostat;
pub mod logging;
pub mod mount;
pub mod props;
