//! The Redis users the front depends on, kept as it set them on every node (a Redis Cluster's
//! every node, or the one Redis), including nodes it did not see at start.
//!
//! Each node keeps its own ACL users and configuration: nothing replicates them, and a node
//! restarted without an ACL file forgets them. Two kinds of users are kept:
//!
//! - the users the front makes for its own tokens: set whole where missing or
//!   changed (a same-named user with other rules would let the read-only token's scripts run
//!   administrative commands);
//! - one user per `--tokens` token ([`Tenant`]), derived from the operator's user of that token
//!   (its password hashes, key and channel patterns, commands and selectors, as `ACL GETUSER`
//!   shows them) with the front's rules appended (the commands that reach beyond one app's keys,
//!   `Table::one_app_rules`), then checked with `ACL DRYRUN`; derived again wherever the
//!   operator's user or the derived one is not as the front left it. The operator's user is
//!   never changed, so nothing the operator does to it removes the front's rules; what the
//!   operator restricts reaches the token within a round. Where the operator's user is off or no
//!   longer accepts the token's password, the derived user is deleted (Redis then closes its
//!   connections) and the token refused ([`Keeper::guard`]); where it is missing, the derived
//!   user is deleted on that node.
//!
//! Every [`EVERY`] the front asks the Cluster for its nodes (`CLUSTER NODES`, through the first
//! node that answers) and, logged in as the URL's own user, checks every user on every node,
//! and applies its settings on every node seen first or restarted since. A node where that
//! fails is logged once per cause: its slots fail meanwhile, and a token whose user the front
//! cannot keep its rules on is refused until it can.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
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
    /// The tokens in force, and those derived for a reload not yet in force.
    tenants: Mutex<Vec<Tenant>>,
    pending: Mutex<Vec<Tenant>>,
    /// Per derived user: why its token is refused now, if it is.
    guards: Mutex<HashMap<String, Arc<Guard>>>,
    round: tokio::sync::Mutex<Round>,
}

/// A `--tokens` token's Redis user: the operator's (`user`), and the one the front derives from
/// it and logs the token in as (`derived`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// The operator's user, named in the file.
    pub user: String,
    /// `redcount-rest-t-<user>-<12 hex digits of the token's SHA-1>`: one per token.
    pub derived: String,
    /// SHA-256 (hex) of the file's password: what `ACL GETUSER` lists of the user's passwords.
    pub password_sha256: String,
    /// A read-only token: its user may not write either (`-@write`).
    pub readonly: bool,
}

impl Tenant {
    /// The token's Redis user, derived from the operator's `user`.
    pub(crate) fn new(token: &str, user: &str, password: &str, readonly: bool) -> Tenant {
        let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes());
        let password_sha256 = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        let tag = &crate::scripts::sha_hex(token.as_bytes())[..12];
        Tenant { user: user.to_string(), derived: format!("redcount-rest-t-{user}-{tag}"), password_sha256, readonly }
    }
}

impl Tenant {
    /// What the operator's user, as ACL GETUSER showed it, says of this token's login.
    fn found(&self, operator: &Value) -> Found {
        let words = |name: &str| -> Vec<String> {
            field(operator, name).map(list).unwrap_or_default().into_iter().map(text).collect()
        };
        let flags = words("flags");
        if *operator == Value::Nil {
            Found::Missing
        } else if flags.iter().any(|f| f == "off") {
            Found::Revoked("is off")
        } else if !flags.iter().any(|f| f == "nopass") && !words("passwords").contains(&self.password_sha256) {
            Found::Revoked("no longer accepts the tokens file's password")
        } else {
            Found::Live
        }
    }
}

/// Why a token is refused now (`None`: it is served), as the keeper last found its user.
#[derive(Default)]
pub(crate) struct Guard(Mutex<Option<String>>);

impl Guard {
    /// The answer's text while the token is refused.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets why (or that it is served); true when that changed.
    fn set(&self, why: Option<String>) -> bool {
        let mut now = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *now != why;
        *now = why;
        changed
    }
}

/// What the keeper found of a tenant's operator user on one node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Found {
    /// On, accepting the token's password: the derived user is in place.
    Live,
    /// Not on that node.
    Missing,
    /// Off, or no longer accepting the token's password (the text says which).
    Revoked(&'static str),
}

/// The front's rules cannot be kept on a tenant's derived user (its log says why).
const CANNOT_KEEP: &str = "ERR the front cannot keep its rules on this token's Redis user (its scripts could reach beyond its app): refused until it can; the front's log says why";

/// Why a token is refused, from what each node showed (`None`: nothing known, keep the guard).
fn verdict(broken: bool, found: &[Found]) -> Option<Option<String>> {
    if broken {
        return Some(Some(CANNOT_KEEP.into()));
    }
    let revoked = found.iter().find_map(|f| match f {
        Found::Revoked(why) => Some(*why),
        _ => None,
    });
    if let Some(why) = revoked {
        return Some(Some(format!(
            "ERR this token's Redis user {why}: the front has closed the token's Redis connections and refuses it until the user is on and accepts the tokens file's password again (checked every {} s)",
            EVERY.as_secs()
        )));
    }
    if found.is_empty() {
        return None;
    }
    if found.iter().all(|f| *f == Found::Missing) {
        return Some(Some(format!(
            "ERR this token's Redis user does not exist: the front refuses the token until it does (checked every {} s)",
            EVERY.as_secs()
        )));
    }
    Some(None)
}

/// What one round learns for the next.
#[derive(Default)]
struct Round {
    known: BTreeSet<String>,
    conns: HashMap<String, MultiplexedConnection>,
    /// (node, user) -> the user as the node showed it (ACL GETUSER) after the front set it.
    shown: HashMap<(String, String), Value>,
    /// (node, derived user) -> the operator's user and the derived one as the node showed them
    /// after the front derived it.
    derived: HashMap<(String, String), (Value, Value)>,
    /// node -> its run id when the settings were applied there.
    runs: HashMap<String, String>,
    /// Nodes where something could not be kept, and why (last said).
    failing: HashMap<String, String>,
}

/// The address a single Redis is known by in the keeper's maps.
const SINGLE: &str = "the Redis";

impl Keeper {
    /// A keeper for the Redis (or the Cluster whose seeds are) `url` (comma-separated, as
    /// `--redis`), of `made` users and `settings`, adding to the users it derives for tokens
    /// the rules `commands` gives for the URL's database.
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
            pending: Default::default(),
            guards: Default::default(),
            round: Default::default(),
        })
    }

    /// The user the front's own set-up logs in as (the URL's), which no tenant may be.
    pub(crate) fn own_user(&self) -> &str {
        self.template.redis_settings().username().unwrap_or("default")
    }

    /// The `ACL SETUSER` that appends the front's rules to `user` (not to its selectors): sent
    /// after each new connection of a token's pool logs in, before its first command, so a
    /// user a restarted Redis made again from its own files has them.
    pub(crate) fn root_rules(&self, user: &str) -> Cmd {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(&self.rules);
        cmd
    }

    /// Why the token of derived user `derived` is refused now, kept up to date by the keeper.
    pub(crate) fn guard(&self, derived: &str) -> Arc<Guard> {
        let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        guards.entry(derived.to_string()).or_default().clone()
    }

    /// Checks, changing nothing, that the operator's user of each of `tenants` exists, is on
    /// and accepts the token's password (on a Cluster: on some node, and on none off or
    /// refusing it). Else the index of the first that does not, and why.
    pub(crate) async fn check_logins(&self, tenants: &[Tenant]) -> Result<(), (usize, String)> {
        let mut round = self.round.lock().await;
        let nodes = self.nodes(&mut round).await.ok_or((0, "no Redis node answers".to_string()))?;
        let mut found: Vec<Vec<Found>> = vec![Vec::new(); tenants.len()];
        for addr in &nodes {
            let Some(conn) = self.connection(&mut round, addr).await else { continue };
            let mut conn = conn.clone();
            for (i, t) in tenants.iter().enumerate() {
                let operator = getuser(&mut conn, &t.user).await.map_err(|e| {
                    (i, format!("{e} on {addr}; the front needs the right to run ACL SETUSER, GETUSER, DELUSER and DRYRUN as the --redis URL's user"))
                })?;
                found[i].push(t.found(&operator));
            }
        }
        for (i, seen) in found.iter().enumerate() {
            if let Some(Found::Revoked(why)) = seen.iter().find(|f| matches!(f, Found::Revoked(_))) {
                return Err((i, format!("the user {why}")));
            }
            if !seen.contains(&Found::Live) {
                return Err((i, "the user does not exist".into()));
            }
        }
        Ok(())
    }

    /// Derives the users of `tenants` on every node now (also those derived before: the
    /// operator may have edited them before a reload), and sets their guards; the keeper keeps
    /// them from [`Keeper::settle`] on. On an error (a user the front cannot change, or whose
    /// rules Redis does not enforce) the error names the user, the node and why.
    pub(crate) async fn keep_tenants(&self, tenants: &[Tenant]) -> Result<(), String> {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = tenants.to_vec();
        let mut round = self.round.lock().await;
        let nodes = self.nodes(&mut round).await.ok_or("no Redis node answers")?;
        let mut found: HashMap<&str, Vec<Found>> = HashMap::new();
        for addr in &nodes {
            // A Cluster node that does not answer now serves no token either; it gets the
            // users in the first round it answers, as a restarted node does.
            let Some(conn) = self.connection(&mut round, addr).await else {
                if self.cluster {
                    tracing::warn!(
                        "Cluster node {addr} does not answer: the front's users for the tokens go on it when it does"
                    );
                    continue;
                }
                return Err(format!("cannot connect as the Redis URL's user to {addr}"));
            };
            let mut conn = conn.clone();
            for t in tenants {
                match self.ensure_tenant(&mut conn, addr, t, &mut round.derived, true).await {
                    Ok(f) => found.entry(&t.derived).or_default().push(f),
                    Err(e) => {
                        round.conns.remove(addr);
                        return Err(format!(
                            "cannot derive the token's Redis user from user {:?} on {addr} ({e}); the front needs the right to run ACL SETUSER, GETUSER, DELUSER and DRYRUN as the --redis URL's user",
                            t.user
                        ));
                    }
                }
            }
        }
        for t in tenants {
            if let Some(why) = verdict(false, found.get(t.derived.as_str()).map(Vec::as_slice).unwrap_or_default()) {
                self.guard(&t.derived).set(why);
            }
        }
        Ok(())
    }

    /// The tokens now in force are `tenants`: the keeper keeps their users from now on, and
    /// deletes on every node the users it derived for tokens no longer in force (removed by a
    /// reload, or of a reload that failed), so their connections close at once.
    pub(crate) async fn settle(&self, tenants: &[Tenant]) {
        let known: Vec<Tenant> = {
            let mut before = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let mut known = std::mem::replace(&mut *before, tenants.to_vec());
            known.append(&mut pending);
            known
        };
        let gone: BTreeSet<&str> =
            known.iter().map(|t| t.derived.as_str()).filter(|d| !tenants.iter().any(|t| t.derived == *d)).collect();
        if gone.is_empty() {
            return;
        }
        let mut round = self.round.lock().await;
        let Some(nodes) = self.nodes(&mut round).await else { return };
        for addr in &nodes {
            let Some(conn) = self.connection(&mut round, addr).await else { continue };
            let mut conn = conn.clone();
            for derived in &gone {
                if drop_user(&mut conn, derived).await.is_err() {
                    tracing::error!("cannot delete the Redis user {derived:?} of a removed token on {addr}");
                }
                round.derived.remove(&(addr.clone(), derived.to_string()));
            }
        }
        self.guards.lock().unwrap_or_else(|e| e.into_inner()).retain(|d, _| !gone.contains(d.as_str()));
    }

    /// On one Redis, derives the token user `derived` again now (a restarted Redis that forgot
    /// it refused a new connection's login); true when it is in place.
    pub(crate) async fn derive_now(&self, derived: &str) -> bool {
        if self.cluster {
            return false;
        }
        let tenant = {
            let (now, pending) = (self.tenants.lock(), self.pending.lock());
            let (now, pending) = (now.unwrap_or_else(|e| e.into_inner()), pending.unwrap_or_else(|e| e.into_inner()));
            now.iter().chain(pending.iter()).find(|t| t.derived == derived).cloned()
        };
        let Some(tenant) = tenant else { return false };
        let mut round = self.round.lock().await;
        let Some(conn) = self.connection(&mut round, SINGLE).await else { return false };
        let mut conn = conn.clone();
        let found = self.ensure_tenant(&mut conn, SINGLE, &tenant, &mut round.derived, true).await;
        matches!(found, Ok(Found::Live))
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
        let mut found: HashMap<String, Vec<Found>> = HashMap::new();
        for addr in &nodes {
            let result = match self.connection(&mut round, addr).await {
                Some(conn) => {
                    let mut conn = conn.clone();
                    let Round { shown, runs, derived, .. } = &mut *round;
                    let made = self.ensure(&mut conn, addr, shown, runs).await;
                    let mut tenant_errors = Vec::new();
                    for t in &tenants {
                        match self.ensure_tenant(&mut conn, addr, t, derived, false).await {
                            Ok(f) => found.entry(t.derived.clone()).or_default().push(f),
                            Err(e) => {
                                broken.insert(t.derived.clone());
                                tenant_errors.push(format!("the token user of {:?}: {e}", t.user));
                            }
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
        for t in &tenants {
            let seen = found.get(&t.derived).map(Vec::as_slice).unwrap_or_default();
            let Some(why) = verdict(broken.contains(&t.derived), seen) else { continue };
            let refused = why.is_some();
            if self.guard(&t.derived).set(why) {
                if refused {
                    let cause = seen
                        .iter()
                        .find_map(|f| match f {
                            Found::Revoked(why) => Some(*why),
                            _ => None,
                        })
                        .unwrap_or("cannot be kept or does not exist");
                    tracing::warn!("a token of Redis user {:?} is refused: the user {cause}", t.user);
                } else {
                    tracing::info!("a token of Redis user {:?} is served again", t.user);
                }
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

    /// Derives tenant `t`'s user on one node where the operator's user or the derived one is
    /// not as the front left it (`force`: anyway), then checks with ACL DRYRUN that Redis
    /// refuses it every command the rules name. Where the operator's user is missing, off, or
    /// does not accept the token's password, deletes the derived user instead (Redis closes its
    /// connections).
    async fn ensure_tenant(
        &self,
        conn: &mut MultiplexedConnection,
        addr: &str,
        t: &Tenant,
        derived: &mut HashMap<(String, String), (Value, Value)>,
        force: bool,
    ) -> Result<Found, String> {
        let key = (addr.to_string(), t.derived.clone());
        let operator = getuser(conn, &t.user).await?;
        let found = t.found(&operator);
        if found != Found::Live {
            derived.remove(&key);
            drop_user(conn, &t.derived).await.map_err(|e| format!("ACL DELUSER: {e}"))?;
            return Ok(found);
        }
        let now = getuser(conn, &t.derived).await?;
        let had = derived.get(&key);
        if !force && had.is_some_and(|(o, d)| *o == operator && *d == now) {
            return Ok(Found::Live);
        }
        let changed = had.is_some() && !force;
        // One command: the user is never without the front's rules. Its selectors (Redis 7)
        // allow commands of their own: each gets the rules too.
        let extra: &[&str] = if t.readonly { &["-@write"] } else { &[] };
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg(&t.derived).arg("reset").arg("on");
        setuser.arg(format!("#{}", t.password_sha256)).arg("sanitize-payload");
        for part in ["keys", "channels", "commands"] {
            setuser.arg(rules_of(&operator, part));
        }
        setuser.arg(&self.rules).arg(extra);
        for s in field(&operator, "selectors").map(list).unwrap_or_default() {
            let mut rules: Vec<String> = ["keys", "channels", "commands"].iter().flat_map(|p| rules_of(s, p)).collect();
            rules.extend(self.rules.iter().cloned());
            rules.extend(extra.iter().map(|r| r.to_string()));
            setuser.arg(format!("({})", rules.join(" ")));
        }
        setuser.query_async::<()>(conn).await.map_err(|e| format!("ACL SETUSER: {e}"))?;
        // Redis itself says whether the user may still run any of them (a rule of the
        // operator's the front did not foresee): then its tokens stay refused. A refusal for a
        // key or channel is not one of the command (a selector may allow it for other keys).
        let mut pipe = redis::pipe();
        for words in &self.probes {
            pipe.cmd("ACL").arg("DRYRUN").arg(&t.derived).arg(words);
        }
        let answers: Vec<Value> =
            pipe.ignore_errors().query_async(conn).await.map_err(|e| format!("ACL DRYRUN: {e}"))?;
        for (words, answer) in self.probes.iter().zip(&answers) {
            if !text(answer).contains("command") {
                return Err(format!("Redis still lets it run {} after the front's rules", words.join(" ")));
            }
        }
        if changed {
            tracing::info!(
                "Redis user {:?} on {addr} (or the token user derived from it) had been changed: derived again, with the front's rules",
                t.user
            );
        }
        derived.insert(key, (operator, getuser(conn, &t.derived).await?));
        Ok(Found::Live)
    }

    /// A cached connection to `addr`, logged in as the URL's user (and over TLS if it says so),
    /// made again when the cached one no longer answers (the node restarted).
    async fn connection<'a>(&self, round: &'a mut Round, addr: &str) -> Option<&'a mut MultiplexedConnection> {
        if let Some(conn) = round.conns.get_mut(addr)
            && redis::cmd("PING").query_async::<Value>(conn).await.is_err()
        {
            round.conns.remove(addr);
        }
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

/// Deletes `user` where it exists (Redis closes its connections).
async fn drop_user(conn: &mut MultiplexedConnection, user: &str) -> redis::RedisResult<()> {
    redis::cmd("ACL").arg("DELUSER").arg(user).query_async::<i64>(conn).await.map(|_| ())
}

/// The rules of `part` (`keys`, `channels`, `commands`) of a user or selector as ACL GETUSER
/// shows them: a string of rules (Redis 7), or a list of patterns (Redis 6: keys, channels).
fn rules_of(user: &Value, part: &str) -> Vec<String> {
    match field(user, part) {
        Some(Value::Array(patterns)) => {
            let prefix = if part == "keys" { "~" } else { "&" };
            patterns.iter().map(|p| format!("{prefix}{}", text(p))).collect()
        }
        Some(v) => text(v).split_whitespace().map(str::to_string).collect(),
        None => Vec::new(),
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
