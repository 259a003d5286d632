//! Native drivers of redcount-core: run an operation in one round trip, falling back to
//! EVAL once on NOSCRIPT, over RESP ([`Direct`]) or, with feature `rest`, an
//! Upstash-compatible REST front (`Rest`). With feature `tower`, a tower layer rate-limits
//! HTTP requests (axum, hyper, tonic) over either (`tower::RateLimitLayer`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), redcount::Error> {
//! use redcount_core::ops::redpacket::Grab;
//! let redis = redcount::Direct::connect("redis://127.0.0.1:6379").await?;
//! let outcome = redis.run(&Grab::new("packet-1", "alice")?).await?;
//! println!("{outcome:?}");
//! # Ok(()) }
//! ```
//!
//! Any transport is a [`Driver`]: it sends one command; the trait's `run` does the rest.
//! Here one that has lost its script cache once:
//!
//! ```
//! use redcount::{Driver, Error};
//! use redcount_core::{Command, ErrorReply, Value, ops::claim::Claim};
//!
//! struct Forgetful(std::sync::atomic::AtomicBool);
//! impl Driver for Forgetful {
//!     async fn send(&self, command: &Command) -> Result<Value, Error> {
//!         if command.parts()[0] == "EVALSHA" && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
//!             return Err(Error::Redis(ErrorReply::new("NOSCRIPT No matching script.")));
//!         }
//!         assert_eq!(command.parts()[0], "EVAL"); // the one fallback, with the source
//!         Ok(Value::Array(vec![Value::Int(1), Value::Int(0)]))
//!     }
//! }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let driver = Forgetful(Default::default());
//! let claimed = driver.run(&Claim::new("bonus", "alice", 60_000).unwrap()).await.unwrap();
//! assert!(claimed.claimed);
//! # });
//! ```
#![warn(missing_docs)]

pub mod direct;
pub mod error;
#[cfg(feature = "rest")]
pub mod rest;
pub mod tls;
#[cfg(feature = "tower")]
pub mod tower;

use std::future::Future;

pub use direct::Direct;
pub use error::{Error, Transport};
use redcount_core::{Command, Operation, Value};

#[cfg(feature = "rest")]
pub use rest::Rest;

/// Something that can send one Redis command and return its reply.
pub trait Driver: Sync {
    /// Sends one command; an error reply is `Err(Error::Redis)`.
    fn send(&self, command: &Command) -> impl Future<Output = Result<Value, Error>> + Send;

    /// Runs `op`: its command, then, only if Redis lost the script (NOSCRIPT), the EVAL
    /// fallback once; then parses the reply. The one driving loop of every transport.
    fn run<O>(&self, op: &O) -> impl Future<Output = Result<O::Outcome, Error>> + Send
    where
        O: Operation + Sync,
    {
        async move {
            let mut call = redcount_core::script::Call::new(op.request());
            let mut reply = loop {
                match self.send(call.command()).await {
                    Err(Error::Redis(err)) if call.retry(&err) => continue,
                    other => break other?,
                }
            };
            // A replay answers what the first call answered: same outcome for the caller.
            reply.take_replay_mark();
            op.parse(reply).map_err(Error::Shape)
        }
    }
}
