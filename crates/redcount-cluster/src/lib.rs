//! Redis Cluster plumbing shared by redcount's native driver (`redcount::Direct`) and its REST
//! front (`redcount-front`); not an API of its own for users, who reach it through those.
//!
//! - [`ClusterLink`]: a redis-rs Cluster connection that is probed when a call waits too long,
//!   replaced when it stops answering or stops following the Cluster, and that ends calls for
//!   a master that does not accept connections (or refuses the login) with it named.
//! - [`cluster_call`]: one call on a connection made with redis-rs's own retries off, sent again
//!   only after a reply proving it did not run (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`),
//!   within a time limit; how it ended otherwise is a [`Stop`].
//! - [`ReplicaWait`] and [`Lanes`]: writes of money acknowledged only once replicas have them
//!   (`WAIT` right after the command, on connections of their own).
#![warn(missing_docs)]

mod call;
mod link;
mod slots;
mod wait;

pub use call::{Hop, Stop, cluster_call, cluster_call_via, cluster_call_waited};
pub use link::{ClusterLink, PROBE_LIMIT, SUSPECT_AFTER};
pub use slots::{Node, SlotRange, first_key, getkeys, slot_ranges, with_address};
pub use wait::{Lanes, Lent, ReplicaWait, WAIT_LANES, waits_for_replicas};
