//! The Redis users the front depends on, kept as it set them on every node (a Redis Cluster's
//! every node, or the one Redis), including nodes it did not see at start.
//!
//! Each node keeps its own ACL users and configuration: nothing replicates them, and a node
//! restarted without an ACL file forgets them. Two kinds of users are kept:
//!
//! - the users the front makes for its own tokens: set whole where missing or
//!   changed (a same-named user with other rules would let the read-only token's scripts run
//!   administrative commands);
//! - the operator's users of `--tokens` (tenants): the front appends its rules (the
//!   commands that reach beyond one app's keys, `Table::one_app_rules`) to the user and to each
//!   of its selectors, then asks Redis (`ACL DRYRUN`) that none of those commands is allowed,
//!   wherever the user is not as the front left it (edited, or from a restarted node's
//!   configuration). Never made where missing: that is the operator's.
//!
//! Every [`EVERY`] the front asks the Cluster for its nodes (`CLUSTER NODES`, through the first
//! node that answers) and, logged in as the URL's own user, checks every user on every node,
//! and applies its settings on every node seen first or restarted since. A node where that
//! fails is logged once per cause: its slots fail meanwhile, and a tenant user the front cannot
//! keep its rules on has its tokens refused ([`Keeper::guard`]) until it can.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

/// How often the nodes are checked.
pub(crate) const EVERY: Duration = Duration::from_secs(2);

/// Keeps users and settings on every node (see the module's documentation).
pub(crate) struct Keeper {
    template: ConnectionInfo,
    seed_addrs: BTreeSet<String>,
    cluster: bool,
    config: AsyncConnectionConfig,
    made: Vec<(String, Cmd)>,
    settings: Vec<Cmd>,
    /// The rules appended to every tenant user, and the commands `ACL DRYRUN` must then refuse.
    rules: Vec<String>,
    probes: Vec<Vec<String>>,
    tenants: std::sync::Mutex<Vec<String>>,
    /// Per tenant user: true while its rules are in force on every node it exists on.
    guards: std::sync::Mutex<HashMap<String, Arc<AtomicBool>>>,
    round: tokio::sync::Mutex<Round>,
}

/// What one round learns for the next.
#[derive(Default)]
struct Round {
    known: BTreeSet<String>,
    conns: HashMap<String, MultiplexedConnection>,
    /// (node, user) -> the user as the node showed it (ACL GETUSER) after the front set it.
    shown: HashMap<(String, String), Value>,
    /// node -> its run id when the settings were applied there.
    runs: HashMap<String, String>,
    /// Nodes where something could not be kept, and why (last said).
    failing: HashMap<String, String>,
}

/// The address a single Redis is known by in the keeper's maps.
const SINGLE: &str = "the Redis";

impl Keeper {
    /// A keeper for the Redis (or the Cluster whose seeds are) `url` (comma-separated, as
    /// `--redis`), of `made` users and `settings`, appending to tenant users the rules
    /// `commands` gives for the URL's database.
    pub(crate) fn new(
        url: &str,
        cluster: bool,
        made: Vec<(String, Cmd)>,
        settings: Vec<Cmd>,
        commands: &crate::commands::Table,
        timeout: Duration,
    ) -> Result<Self, String> {
        // redis-rs reads the URLs (credentials, TLS, database); only the address changes per node.
        let seeds: Vec<ConnectionInfo> = url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.into_connection_info().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let template = seeds.first().cloned().ok_or("no Redis URL")?;
        let seed_addrs = seeds
            .iter()
            .filter_map(|s| match s.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Some(format!("{host}:{port}"))
                }
                _ => None,
            })
            .collect();
        let limit = Some(timeout.max(Duration::from_secs(1)));
        let db = template.redis_settings().db();
        let (rules, probes) = (commands.one_app_rules(db), commands.one_app_probes(db));
        Ok(Keeper {
            template,
            seed_addrs,
            cluster,
            config: AsyncConnectionConfig::new().set_connection_timeout(limit).set_response_timeout(limit),
            made,
            settings,
            rules,
            probes,
            tenants: Default::default(),
            guards: Default::default(),
            round: Default::default(),
        })
    }

    /// The user the front's own set-up logs in as (the URL's), which no tenant may be.
    pub(crate) fn own_user(&self) -> &str {
        self.template.redis_settings().username().unwrap_or("default")
    }

    /// The `ACL SETUSER` that appends the front's rules to `user` (not to its selectors): sent
    /// before each new connection of a tenant's pool, so a restarted Redis whose configuration
    /// made the user again has them before the first command.
    pub(crate) fn root_rules(&self, user: &str) -> Cmd {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(&self.rules);
        cmd
    }

    /// True while the front's rules are in force on `user` (an unknown user: true).
    pub(crate) fn guard(&self, user: &str) -> Arc<AtomicBool> {
        let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        guards.entry(user.to_string()).or_insert_with(|| Arc::new(AtomicBool::new(true))).clone()
    }

    /// Puts the front's rules on `users` on every node now, then keeps them too. On an error
    /// (a user the front cannot change, or whose rules Redis does not enforce) the error names
    /// the user, the node and why.
    pub(crate) async fn keep_tenants(&self, users: &[String]) -> Result<(), String> {
        let mut round = self.round.lock().await;
        let nodes = self.nodes(&mut round).await.ok_or("no Redis node answers")?;
        for addr in &nodes {
            // A Cluster node that does not answer now serves no token either; it gets the
            // rules in the first round it answers, as a restarted node does.
            let Some(conn) = self.connection(&mut round, addr).await else {
                if self.cluster {
                    tracing::warn!(
                        "Cluster node {addr} does not answer: the front's rules go on its users when it does"
                    );
                    continue;
                }
                return Err(format!("cannot connect as the Redis URL's user to {addr}"));
            };
            let mut conn = conn.clone();
            for user in users {
                if let Err(e) = self.ensure_tenant(&mut conn, addr, user, &mut round.shown, true).await {
                    round.conns.remove(addr);
                    return Err(format!(
                        "cannot put the front's rules on Redis user {user:?} on {addr} ({e}); the front needs the right to run ACL SETUSER, GETUSER and DRYRUN as the --redis URL's user"
                    ));
                }
            }
        }
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        for user in users {
            self.guard(user).store(true, Ordering::Relaxed);
            if !tenants.contains(user) {
                tenants.push(user.clone());
            }
        }
        Ok(())
    }

    /// Keeps only `users` of the tenant users (those of the tokens now in force).
    pub(crate) fn retain_tenants(&self, users: &[String]) {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner()).retain(|u| users.contains(u));
    }

    /// Checks every node every [`EVERY`], until the process ends.
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            self.check().await;
            tokio::time::sleep(EVERY).await;
        }
    }

    /// One round over every node.
    async fn check(&self) {
        let mut round = self.round.lock().await;
        let Some(nodes) = self.nodes(&mut round).await else { return };
        let tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut broken: BTreeSet<String> = BTreeSet::new();
        for addr in &nodes {
            let result = match self.connection(&mut round, addr).await {
                Some(conn) => {
                    let mut conn = conn.clone();
                    let Round { shown, runs, .. } = &mut *round;
                    let made = self.ensure(&mut conn, addr, shown, runs).await;
                    let mut tenant_errors = Vec::new();
                    for user in &tenants {
                        if let Err(e) = self.ensure_tenant(&mut conn, addr, user, shown, false).await {
                            broken.insert(user.clone());
                            tenant_errors.push(format!("user {user:?}: {e}"));
                        }
                    }
                    match (made, tenant_errors.is_empty()) {
                        (Err(e), _) => Err(e),
                        (Ok(()), false) => Err(tenant_errors.join("; ")),
                        (Ok(()), true) => Ok(()),
                    }
                }
                None => Err(format!("cannot connect as the Redis URL's user to {addr}")),
            };
            // Said once per node and cause, not every round: the node's slots fail meanwhile.
            match result {
                Ok(()) => {
                    if round.failing.remove(addr).is_some() {
                        tracing::info!("the front's Redis users are in place on {addr} again");
                    }
                }
                Err(e) => {
                    round.conns.remove(addr);
                    if round.failing.get(addr) != Some(&e) {
                        tracing::error!(
                            "cannot keep the front's Redis users on {addr} ({e}): requests for its slots, or of the tokens of those users, fail"
                        );
                        round.failing.insert(addr.clone(), e);
                    }
                }
            }
        }
        for user in &tenants {
            let ok = !broken.contains(user);
            if self.guard(user).swap(ok, Ordering::Relaxed) != ok && ok {
                tracing::info!("the tokens of Redis user {user:?} are served again: the front's rules are in force");
            }
        }
    }

    /// The nodes to keep users on: a Cluster's as the first reachable node sees them (seeds
    /// first, then those seen before); the one Redis.
    async fn nodes(&self, round: &mut Round) -> Option<Vec<String>> {
        if !self.cluster {
            return Some(vec![SINGLE.to_string()]);
        }
        let known: Vec<String> =
            self.seed_addrs.iter().chain(round.known.difference(&self.seed_addrs)).cloned().collect();
        for addr in known {
            let Some(conn) = self.connection(round, &addr).await else { continue };
            match redis::cmd("CLUSTER").arg("NODES").query_async::<String>(conn).await {
                Ok(text) => {
                    let nodes = parse_nodes(&text);
                    round.known = nodes.iter().cloned().chain(self.seed_addrs.iter().cloned()).collect();
                    let known = round.known.clone();
                    round.conns.retain(|addr, _| known.contains(addr));
                    // Nodes gone from the Cluster are forgotten (seen again, they are new).
                    round.shown.retain(|(addr, _), _| known.contains(addr));
                    round.runs.retain(|addr, _| known.contains(addr));
                    round.failing.retain(|addr, _| known.contains(addr));
                    return Some(nodes);
                }
                Err(_) => {
                    round.conns.remove(&addr);
                }
            }
        }
        None
    }

    /// Sets every made user on one node where it is missing, or where it is not as the front
    /// set it there last (its rules or password changed since); on a node seen for the first
    /// time or restarted, sets them anyway (`ACL SETUSER … reset …` is idempotent), so what the
    /// node shows afterwards is what is compared from then on. Applies the settings there too.
    async fn ensure(
        &self,
        conn: &mut MultiplexedConnection,
        addr: &str,
        shown: &mut HashMap<(String, String), Value>,
        runs: &mut HashMap<String, String>,
    ) -> Result<(), String> {
        let fail = |what: &str, e: redis::RedisError| format!("{what}: {e}");
        // The settings on a node seen for the first time or restarted since (a new run id), before
        // the users: a node that refuses ACL still gets them.
        let info: String = redis::cmd("INFO").arg("server").query_async(conn).await.map_err(|e| fail("INFO", e))?;
        let run_id = info.lines().find_map(|l| l.strip_prefix("run_id:")).map(str::trim).unwrap_or_default();
        if runs.get(addr).map(String::as_str) != Some(run_id) {
            for s in &self.settings {
                // Best effort, as at start (a managed Redis may refuse CONFIG SET).
                let _ = s.query_async::<Value>(conn).await;
            }
            runs.insert(addr.to_string(), run_id.to_string());
            // A restarted node's users come from its own files: every one is set again.
            shown.retain(|(a, _), _| a != addr);
        }
        let (mut made, mut changed) = (Vec::new(), Vec::new());
        for (user, setuser) in &self.made {
            let found = getuser(conn, user).await?;
            let key = (addr.to_string(), user.clone());
            let set = match (&found, shown.get(&key)) {
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
                shown.insert(key, getuser(conn, user).await?);
            }
        }
        let at = if self.cluster { format!("Cluster node {addr}") } else { addr.to_string() };
        if !made.is_empty() {
            tracing::warn!(
                "made the front's Redis user {} on {at}, which did not have it (a node added, promoted or restarted since)",
                made.join(", ")
            );
        }
        if !changed.is_empty() {
            tracing::warn!(
                "set the front's Redis user {} on {at} back to its rules and password: they had been changed",
                changed.join(", ")
            );
        }
        Ok(())
    }

    /// Puts the front's rules on tenant `user` on one node where it is not as the front left
    /// it (`force`: anyway), then checks with ACL DRYRUN that Redis refuses it every command
    /// the rules name. A node without the user is left alone.
    async fn ensure_tenant(
        &self,
        conn: &mut MultiplexedConnection,
        addr: &str,
        user: &str,
        shown: &mut HashMap<(String, String), Value>,
        force: bool,
    ) -> Result<(), String> {
        let found = getuser(conn, user).await?;
        let key = (addr.to_string(), user.to_string());
        if found == Value::Nil || (!force && shown.get(&key) == Some(&found)) {
            shown.insert(key, found);
            return Ok(());
        }
        let had = shown.contains_key(&key);
        // Selectors (Redis 7) allow commands of their own: each is set again with the rules
        // appended, as one command, so the user is never left without them.
        let mut setuser = self.root_rules(user);
        let selectors = field(&found, "selectors").map(list).unwrap_or_default();
        if !selectors.is_empty() {
            setuser.arg("clearselectors");
            for s in selectors {
                let part = |name: &str| field(s, name).map(text).unwrap_or_default();
                let rules = [part("keys"), part("channels"), part("commands"), self.rules.join(" ")];
                let rules: Vec<&str> = rules.iter().map(String::as_str).filter(|r| !r.is_empty()).collect();
                setuser.arg(format!("({})", rules.join(" ")));
            }
        }
        setuser.query_async::<()>(conn).await.map_err(|e| format!("ACL SETUSER: {e}"))?;
        // Redis itself says whether the user may still run any of them (a rule of its own
        // the front did not foresee): then its tokens stay refused.
        let mut pipe = redis::pipe();
        for words in &self.probes {
            pipe.cmd("ACL").arg("DRYRUN").arg(user).arg(words);
        }
        let answers: Vec<Value> =
            pipe.ignore_errors().query_async(conn).await.map_err(|e| format!("ACL DRYRUN: {e}"))?;
        for (words, answer) in self.probes.iter().zip(&answers) {
            let allowed = matches!(answer, Value::Okay) || matches!(answer, Value::SimpleString(s) if s == "OK");
            if allowed {
                return Err(format!("Redis still lets it run {} after the front's rules", words.join(" ")));
            }
        }
        if had && !force {
            tracing::warn!(
                "Redis user {user:?} on {addr} had been changed: the front's rules (the commands that reach beyond one app) are on it again"
            );
        }
        shown.insert(key, getuser(conn, user).await?);
        Ok(())
    }

    /// A cached connection to `addr`, logged in as the URL's user (and over TLS if it says so).
    async fn connection<'a>(&self, round: &'a mut Round, addr: &str) -> Option<&'a mut MultiplexedConnection> {
        if !round.conns.contains_key(addr) {
            let info = if self.cluster {
                redcount_cluster::with_address(&self.template, addr)?
            } else {
                self.template.clone()
            };
            let client = redis::Client::open(info).ok()?;
            let conn = client.get_multiplexed_async_connection_with_config(&self.config).await.ok()?;
            round.conns.insert(addr.to_string(), conn);
        }
        round.conns.get_mut(addr)
    }
}

async fn getuser(conn: &mut MultiplexedConnection, user: &str) -> Result<Value, String> {
    redis::cmd("ACL").arg("GETUSER").arg(user).query_async(conn).await.map_err(|e| format!("ACL GETUSER: {e}"))
}

/// The value of `name` in a RESP2 (flat pairs) or RESP3 map.
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Map(pairs) => pairs.iter().find(|(k, _)| text(k) == name).map(|(_, v)| v),
        Value::Array(flat) => flat.chunks(2).find(|kv| kv.len() == 2 && text(&kv[0]) == name).map(|kv| &kv[1]),
        _ => None,
    }
}

fn list(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a.iter().collect(),
        _ => Vec::new(),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    }
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

    #[test]
    fn user_fields_read_in_either_protocol() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![b("flags"), Value::Array(vec![b("on")]), b("selectors"), Value::Array(vec![])]);
        let resp3 = Value::Map(vec![(b("selectors"), Value::Array(vec![Value::Nil]))]);
        assert_eq!(field(&resp2, "selectors").map(list).map(|l| l.len()), Some(0));
        assert_eq!(field(&resp3, "selectors").map(list).map(|l| l.len()), Some(1));
        assert!(field(&resp2, "keys").is_none());
    }
}
