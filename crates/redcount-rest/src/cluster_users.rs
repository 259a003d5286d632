//! On a Redis Cluster the front's own users and settings on every node, including the ones it
//! did not see at start.
//!
//! Each node keeps its own ACL users and configuration: nothing replicates them, and a node
//! restarted without an ACL file forgets them. The front's clients log in as users the front
//! makes (`restricted_login`), so a replica added later and then promoted, or a master
//! restarted, refused every login: its slots answered 504 until the front was restarted,
//! with about a hundred failed logins a second in Redis's ACL log (attacker pass,
//! 2026-11-26). Every [`EVERY`] the front asks the Cluster for its nodes (`CLUSTER NODES`,
//! through the first node that answers) and, logged in as the URL's own user, sets each user
//! on every node where it is missing or no longer as the front set it (a same-named user with
//! other rules let the read-only token's scripts run administrative commands: second attacker
//! pass), and applies its settings on every node seen first or restarted since. A node where
//! that fails is logged once per cause: its slots fail meanwhile.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

/// How often the nodes are checked.
pub(crate) const EVERY: Duration = Duration::from_secs(2);

/// Keeps `users` (name, the `ACL SETUSER` that makes it) and `settings` on every node of the
/// Cluster whose seeds are `seeds` (comma-separated URLs, as `--redis`), until the process ends.
pub(crate) async fn run(seeds: String, users: Vec<(String, Cmd)>, settings: Vec<Cmd>, timeout: Duration) {
    // redis-rs reads the URLs (credentials, TLS, database); only the address changes per node.
    let seeds: Vec<ConnectionInfo> = seeds
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.into_connection_info().ok())
        .collect();
    let Some(template) = seeds.first().cloned() else { return };
    let seed_addrs: BTreeSet<String> = seeds
        .iter()
        .filter_map(|s| match s.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some(format!("{host}:{port}"))
            }
            _ => None,
        })
        .collect();
    let mut known = seed_addrs.clone();
    let mut conns: HashMap<String, MultiplexedConnection> = HashMap::new();
    // (node, user) -> the user as the node showed it (ACL GETUSER) after the front set it there.
    let mut rules: HashMap<(String, String), Value> = HashMap::new();
    // node -> its run id when the settings were applied there.
    let mut runs: HashMap<String, String> = HashMap::new();
    // Nodes where the users could not be kept, and why (last said).
    let mut failing: HashMap<String, String> = HashMap::new();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_secs(1))))
        .set_response_timeout(Some(timeout.max(Duration::from_secs(1))));
    // The first round at once: the users made at start went to one node only, and a replica
    // promoted before the first round would refuse the front's logins.
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(EVERY).await;
        }
        first = false;
        // The nodes as the first reachable node sees them (seeds first, then those seen before).
        let mut nodes = None;
        for addr in seed_addrs.iter().chain(known.difference(&seed_addrs)) {
            let Some(conn) = connection(&mut conns, &template, addr, &config).await else { continue };
            match redis::cmd("CLUSTER").arg("NODES").query_async::<String>(conn).await {
                Ok(text) => {
                    nodes = Some(parse_nodes(&text));
                    break;
                }
                Err(_) => {
                    conns.remove(addr);
                }
            }
        }
        let Some(nodes) = nodes else { continue };
        known = nodes.iter().cloned().chain(seed_addrs.iter().cloned()).collect();
        conns.retain(|addr, _| known.contains(addr));
        // Nodes gone from the Cluster are forgotten (seen again, they are new).
        rules.retain(|(addr, _), _| known.contains(addr));
        runs.retain(|addr, _| known.contains(addr));
        failing.retain(|addr, _| known.contains(addr));
        for addr in &nodes {
            let result = match connection(&mut conns, &template, addr, &config).await {
                Some(conn) => ensure(conn, &users, &settings, addr, &mut rules, &mut runs).await,
                None => Err(format!("cannot connect as the Redis URL's user to {addr}")),
            };
            // Said once per node and cause, not every round: the node's slots fail meanwhile.
            match result {
                Ok(()) => {
                    if failing.remove(addr).is_some() {
                        tracing::info!("the front's Redis users are in place on Cluster node {addr} again");
                    }
                }
                Err(e) => {
                    conns.remove(addr);
                    if failing.get(addr) != Some(&e) {
                        tracing::error!(
                            "cannot keep the front's Redis users on Cluster node {addr} ({e}): requests for its slots fail"
                        );
                        failing.insert(addr.clone(), e);
                    }
                }
            }
        }
    }
}

/// Sets every user on one node where it is missing, or where it is not as the front set it
/// there last (its rules or password changed since: by hand, or by a restart with an ACL file
/// that has the same name with other rules, which let the read-only token's scripts run
/// administrative commands there, attacker pass 2026-11-26); and, on a node seen for the first
/// time, sets them anyway (`ACL SETUSER … reset …` is idempotent), so what the node shows
/// afterwards is what is compared from then on.
async fn ensure(
    conn: &mut MultiplexedConnection,
    users: &[(String, Cmd)],
    settings: &[Cmd],
    addr: &str,
    rules: &mut HashMap<(String, String), Value>,
    runs: &mut HashMap<String, String>,
) -> Result<(), String> {
    let fail = |what: &str, e: redis::RedisError| format!("{what}: {e}");
    // The settings on a node seen for the first time or restarted since (a new run id), before
    // the users: a node that refuses ACL still gets them.
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await.map_err(|e| fail("INFO", e))?;
    let run_id = info.lines().find_map(|l| l.strip_prefix("run_id:")).map(str::trim).unwrap_or_default();
    if runs.get(addr).map(String::as_str) != Some(run_id) {
        for s in settings {
            // Best effort, as at start (a managed Redis may refuse CONFIG SET).
            let _ = s.query_async::<Value>(conn).await;
        }
        runs.insert(addr.to_string(), run_id.to_string());
    }
    let (mut made, mut changed) = (Vec::new(), Vec::new());
    for (user, setuser) in users {
        let getuser = redis::cmd("ACL").arg("GETUSER").arg(user).to_owned();
        let found: Value = getuser.query_async(conn).await.map_err(|e| fail("ACL GETUSER", e))?;
        let key = (addr.to_string(), user.clone());
        let set = match (&found, rules.get(&key)) {
            (Value::Nil, _) => {
                made.push(user.as_str());
                true
            }
            (now, Some(before)) if now != before => {
                changed.push(user.as_str());
                true
            }
            (_, Some(_)) => false,
            (_, None) => true,
        };
        if set {
            setuser.query_async::<()>(conn).await.map_err(|e| fail("ACL SETUSER", e))?;
            let shown: Value = getuser.query_async(conn).await.map_err(|e| fail("ACL GETUSER", e))?;
            rules.insert(key, shown);
        }
    }
    if !made.is_empty() {
        tracing::warn!(
            "made the front's Redis user {} on Cluster node {addr}, which did not have it (a node added, promoted or restarted since)",
            made.join(", ")
        );
    }
    if !changed.is_empty() {
        tracing::warn!(
            "set the front's Redis user {} on Cluster node {addr} back to its rules and password: they had been changed",
            changed.join(", ")
        );
    }
    Ok(())
}

/// A cached connection to `addr`, logged in as `template`'s user (and over TLS if it says so).
async fn connection<'a>(
    conns: &'a mut HashMap<String, MultiplexedConnection>,
    template: &ConnectionInfo,
    addr: &str,
    config: &AsyncConnectionConfig,
) -> Option<&'a mut MultiplexedConnection> {
    if !conns.contains_key(addr) {
        let client = redis::Client::open(redcount::direct::with_address(template, addr)?).ok()?;
        let conn = client.get_multiplexed_async_connection_with_config(config).await.ok()?;
        conns.insert(addr.to_string(), conn);
    }
    conns.get_mut(addr)
}

/// The address of every node `CLUSTER NODES` lists that is not failed, without an address or
/// still joining (`host:port`, the cluster bus port left out).
fn parse_nodes(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_id, addr, flags) = (fields.next()?, fields.next()?, fields.next()?);
            if flags.split(',').any(|f| matches!(f, "fail" | "noaddr" | "handshake")) {
                return None;
            }
            // ip:port@cport[,hostname]
            let addr = addr.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            (!host.is_empty() && port.parse::<u16>().is_ok()).then(|| addr.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lists_live_nodes_only() {
        let text = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    b 127.0.0.1:7001@17001,host.example master - 0 0 2 connected 5461-10922\n\
                    c 127.0.0.1:7002@17002 master,fail - 0 0 3 connected\n\
                    d :0@0 slave,noaddr a 0 0 3 connected\n\
                    e 127.0.0.1:7003@17003 slave a 0 0 1 connected\n";
        assert_eq!(parse_nodes(text), ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7003"]);
    }
}
