//! redcount's integration tests: one binary, real servers.

mod bad_input;
mod cluster_native;
mod concurrency;
mod decisions;
mod degraded;
mod drain;
mod durability;
mod faults;
mod fencing;
mod front_bounds;
mod front_tokens;
mod front_trust;
mod gcra;
mod local;
mod model;
mod namespace;
mod observability;
mod openapi;
mod primitives;
mod rest;
mod scenario;
mod scripts;
mod tls;
mod worker;
mod writes_kept;
