//! Native drivers of redcount-core: run an operation over RESP with one round trip,
//! falling back to EVAL once on NOSCRIPT.
#![warn(missing_docs)]

pub mod direct;

pub use direct::{Direct, Error};
