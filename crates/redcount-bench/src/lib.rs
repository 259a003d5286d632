//! redcount's benchmark harness (`cargo xtask bench`, `redcount bench`): the same scenarios
//! over direct RESP, a REST front and the worker, side by side in one run, each checked
//! against its invariant, beside the naive client-side ways.
//!
//! [`harness`] is the one drive loop, row type and percentile; [`suite`] (`bench all`) and
//! [`rest`] (`bench rest`) are the scenarios run on it.
#![warn(missing_docs)]

pub mod harness;
pub mod rest;
pub mod suite;
