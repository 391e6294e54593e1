//! densefs: a transparent, compressing overlay file system.
//!
//! Layers, bottom up (see docs/ARCHITECTURE.md):
//! - [`codec`]: pure compress/decompress functions, one table row per codec;
//! - [`engine`]: the compression service engine — policies, the CPU pool and accelerators;
//! - [`format`]: the container format (header, slot descriptors) and its offset arithmetic;
//! - [`core`]: the file system, independent of FUSE;
//! - [`fuse`]: the thin FUSE adapter;
//! - [`cli`]: the command line (main.rs only parses and dispatches).

pub mod checksum;
pub mod cli;
pub mod codec;
pub mod control;
pub mod core;
pub mod engine;
pub mod format;
pub mod fuse;
pub mod inspect;
