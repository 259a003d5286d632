//! The `redcount` command's library side: the native HTTP server ([`serve`]) and the
//! red-packet claim drain to SQLite ([`drain`]).
#![warn(missing_docs)]

pub mod drain;
pub mod serve;
