//! redcount's benchmark harness (`cargo xtask bench`, which runs the `redcount-bench` command): the same scenarios
//! over direct RESP, a REST front and the worker, side by side in one run, each checked
//! against its invariant, beside the naive client-side ways.
//!
//! [`harness`] is the one drive loop, row type and percentile; [`suite`] (`bench all`) and
//! [`rest`] (`bench rest`) are the scenarios run on it, and [`replicas`] (`bench replicas`) the
//! cost of waiting for a replica; [`workers`] (`bench workers`) sets the workers side by side
//! under workerd.
#![warn(missing_docs)]

pub mod harness;
pub mod replicas;
pub mod rest;
pub mod suite;
pub mod workers;

/// A benchmark that could not run to the end.
#[derive(Debug)]
pub enum Error {
    /// A driver call failed.
    Driver(redcount::Error),
    /// A connection, an HTTP exchange or an invariant check failed.
    Failed(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Driver(e) => e.fmt(f),
            Error::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<redcount::Error> for Error {
    fn from(e: redcount::Error) -> Self {
        Error::Driver(e)
    }
}

impl From<redcount_core::InputError> for Error {
    fn from(e: redcount_core::InputError) -> Self {
        Error::Driver(e.into())
    }
}
