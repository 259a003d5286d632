//! # redcount-core
//!
//! The sans-IO heart of redcount: atomic counting primitives for Redis, each one Lua
//! script run in one round trip. This crate turns typed operations into Redis commands and
//! Upstash REST bodies, and replies back into typed outcomes. It never does I/O, never
//! reads a clock and never draws randomness of its own: time and a [`rand_core`] RNG come
//! in as parameters, so every path is deterministic under test.
//!
//! ```text
//!            validated input                         bytes on the wire
//!  caller ──▶ ops::X::new(..) ──▶ Request ──▶ Command ──▶ REST JSON body / RESP ──▶ (I/O: caller)
//!                                    │                                               │
//!  caller ◀── Outcome ◀── op.parse(Value) ◀── rest::decode_reply / RESP reader ◀────┘
//!                                    └── on NOSCRIPT: script::Call::retry() = EVAL, once
//! ```
//!
//! ```
//! use redcount_core::{Operation, Value};
//! use redcount_core::ops::redpacket::{Grab, GrabOutcome};
//!
//! let grab = Grab::new("packet-1", "alice").unwrap(); // validated: bad ids never reach Redis
//! let command = grab.request().command();             // EVALSHA <sha> 4 <keys…> alice
//! assert_eq!(command.parts()[0], "EVALSHA");
//! let body = command.to_rest_body();                  // or the same as RESP, by the caller
//! assert!(body.starts_with(r#"["EVALSHA","#));
//! // Redis answered {1, 250, 3, 7}: won 250 cents, third claim, 7 shares left.
//! let reply = Value::Array(vec![Value::Int(1), Value::Int(250), Value::Int(3), Value::Int(7)]);
//! assert_eq!(grab.parse(reply).unwrap(), GrabOutcome::Won { amount: 250, index: 3, remaining: 7 });
//! ```
//!
//! `no_std` + `alloc`; the error types implement `core::error::Error`, so the default `std`
//! feature adds nothing today.
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]

extern crate alloc;

pub mod b64;
pub mod command;
pub mod error;
pub mod json;
pub mod keys;
pub mod ops;
pub mod ratelimit;
pub mod rest;
pub mod script;
pub mod sha1;
pub mod split;
pub mod text;
pub mod validate;
pub mod value;

pub use command::Command;
pub use error::{ErrorKind, ErrorReply, InputError, Problem, ShapeError};
pub use ops::Operation;
pub use script::{Invocation, Request, Script};
pub use value::Value;
