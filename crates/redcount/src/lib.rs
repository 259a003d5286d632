//! Native drivers of redcount-core: run an operation in one round trip, falling back to
//! EVAL once on NOSCRIPT, over RESP ([`Direct`]) or an Upstash-compatible REST front ([`Rest`]).
#![warn(missing_docs)]

pub mod direct;
#[cfg(feature = "rest")]
pub mod rest;

use std::future::Future;

pub use direct::{Direct, Error};
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
