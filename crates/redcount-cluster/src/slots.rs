//! What a Cluster says of itself: its nodes, which master serves which slots, where a
//! command's keys are.

use std::fmt;

use redis::Value;
use redis::cluster_routing::SingleNodeRoutingInfo;

/// A Cluster node, as the Cluster names it (`CLUSTER SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    /// Its host name or address.
    pub host: String,
    /// Its port.
    pub port: u16,
}

impl Node {
    /// `host:port` (the last colon splits, so an IPv6 address keeps its own).
    pub fn parse(addr: &str) -> Option<Node> {
        let (host, port) = addr.rsplit_once(':')?;
        Some(Node { host: host.to_string(), port: port.parse().ok()? })
    }

    /// redis-rs's route to this node.
    pub(crate) fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::ByAddress { host: self.host.clone(), port: self.port }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A range of slots and the master that serves it, as `CLUSTER SLOTS` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// Its first slot.
    pub first: u16,
    /// Its last slot (included).
    pub last: u16,
    /// The master that serves it.
    pub master: Node,
}

/// `template` (a seed, with its credentials, TLS and database as redis-rs read them) with its
/// address replaced by `addr` (`host:port`, as `CLUSTER NODES` and `CLUSTER SLOTS` give it).
pub fn with_address(template: &redis::ConnectionInfo, addr: &str) -> Option<redis::ConnectionInfo> {
    use redis::ConnectionAddr;
    let (host, port) = addr.rsplit_once(':')?;
    let (host, port) = (host.to_string(), port.parse().ok()?);
    let addr = match template.addr() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
        ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
            ConnectionAddr::TcpTls { host, port, insecure: *insecure, tls_params: tls_params.clone() }
        }
        _ => return None,
    };
    Some(template.clone().set_addr(addr))
}

/// The address of a node's connection settings (TCP, with TLS or without).
pub(crate) fn node_of(info: &redis::ConnectionInfo) -> Option<Node> {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            Some(Node { host: host.clone(), port: *port })
        }
        _ => None,
    }
}

/// `COMMAND GETKEYS` for `cmd`: Redis's own key positions, for any command (`None` for a
/// command with a cursor argument, which has no fixed text).
pub fn getkeys(cmd: &redis::Cmd) -> Option<redis::Cmd> {
    let mut getkeys = redis::cmd("COMMAND");
    getkeys.arg("GETKEYS");
    for a in cmd.args_iter() {
        match a {
            redis::Arg::Simple(b) => getkeys.arg(b),
            _ => return None,
        };
    }
    Some(getkeys)
}

/// The first key of a `COMMAND GETKEYS` reply.
pub fn first_key(reply: Value) -> Option<Vec<u8>> {
    match reply {
        Value::Array(keys) => match keys.into_iter().next()? {
            Value::BulkString(k) => Some(k),
            Value::SimpleString(k) => Some(k.into_bytes()),
            _ => None,
        },
        _ => None,
    }
}

/// A node of a `CLUSTER SLOTS` range (`[host, port, id, …]`).
fn listed_node(v: &Value) -> Option<Node> {
    let Value::Array(n) = v else { return None };
    let host = match n.first()? {
        Value::BulkString(h) => String::from_utf8_lossy(h).into_owned(),
        Value::SimpleString(h) => h.clone(),
        _ => return None,
    };
    let Value::Int(port) = n.get(1)? else { return None };
    Some(Node { host, port: u16::try_from(*port).ok()? })
}

/// Every node a `CLUSTER SLOTS` reply lists, masters and replicas, once each.
pub(crate) fn listed_nodes(reply: &Value) -> Vec<Node> {
    let mut out: Vec<Node> = Vec::new();
    let Value::Array(ranges) = reply else { return out };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        for node in parts.iter().skip(2).filter_map(listed_node) {
            if !out.contains(&node) {
                out.push(node);
            }
        }
    }
    out
}

/// The ranges of a `CLUSTER SLOTS` reply (the first node of each is its master); `None` for a
/// reply of another shape.
pub fn slot_ranges(reply: &Value) -> Option<Vec<SlotRange>> {
    let slot = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Value::Array(ranges) = reply else { return None };
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { return None };
        let master = listed_node(parts.get(2)?)?;
        out.push(SlotRange { first: slot(parts.first())?, last: slot(parts.get(1))?, master });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use redis::{ConnectionAddr, IntoConnectionInfo};

    use super::*;

    #[test]
    fn addresses_are_swapped_keeping_credentials_tls_and_database() {
        let template = "rediss://u:p%40x@a.example:7000/3".into_connection_info().unwrap();
        let node = with_address(&template, "::1:7001").unwrap();
        assert!(matches!(node.addr(), ConnectionAddr::TcpTls { host, port: 7001, .. } if host == "::1"));
        assert_eq!(node.redis_settings().db(), 3);
        assert_eq!(node.redis_settings().username(), Some("u"));
        assert_eq!(node.redis_settings().password(), Some("p@x"));
        let plain = with_address(&"redis://127.0.0.1:7000/".into_connection_info().unwrap(), "10.0.0.2:7002").unwrap();
        assert!(matches!(plain.addr(), ConnectionAddr::Tcp(h, 7002) if h == "10.0.0.2"));
        assert!(with_address(&template, "no-port").is_none());
    }

    #[test]
    fn cluster_slots_are_read_with_each_master() {
        let node = |host: &str, port: i64, id: &str| {
            Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(id.into())])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000, "a"),
                node("10.0.0.4", 7003, "d"),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("10.0.0.2", 7001, "b")]),
        ]);
        let listed: Vec<String> = listed_nodes(&reply).iter().map(ToString::to_string).collect();
        assert_eq!(listed, ["10.0.0.1:7000", "10.0.0.4:7003", "10.0.0.2:7001"], "masters and replicas");
        let ranges = slot_ranges(&reply).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!((ranges[0].first, ranges[0].last, ranges[0].master.to_string()), (0, 5460, "10.0.0.1:7000".into()));
        assert_eq!(ranges[1].master.to_string(), "10.0.0.2:7001");
        let bad = Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(70_000), node("h", 1, "x")])]);
        assert!(slot_ranges(&bad).is_none(), "a slot past 65535 is refused");
    }
}
