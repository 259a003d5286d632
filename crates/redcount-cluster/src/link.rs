//! A Redis Cluster connection that is replaced when it stops answering or stops following the
//! Cluster, and that gives up on calls for a master that is down.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::ErrorKind;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

use crate::slots::{listed_nodes, node_of};
use crate::{Node, SlotRange, first_key, getkeys, slot_ranges, with_address};

/// A Redis Cluster connection that is replaced when it stops answering or stops following
/// the Cluster, and that gives up on calls for a master that is down.
///
/// redis-rs's Cluster connection can stop answering for good: under a slot migration with a
/// busy machine (about one run in three of `rest::a_slot_migrated_in_the_middle_of_a_storm`
/// with one core kept busy), every command through it waited until its time limit, for as
/// long as the process ran, and it sent nothing to any node while the nodes answered other
/// clients. So a call still waiting after [`SUSPECT_AFTER`] has the connection probed with a
/// `PING` to every node known (the seeds, and every node the Cluster listed when last asked),
/// all at once: any answer, an error reply too, shows it works (one node may just be paused);
/// no answer within [`PROBE_LIMIT`] while a new connection answers one puts the new connection
/// in its place (made from those nodes, those that answer). When a `PING` is answered, the
/// probe reads `CLUSTER SLOTS` from the first node to answer and looks at each master:
/// one that refuses a TCP connection is noted, and calls for its slots end with it named
/// ([`Stop::Unreachable`](crate::Stop::Unreachable)) instead of waiting out their limit; one that answers while what
/// the connection routes to its slots does not means a failover the connection did not
/// follow, and it is replaced by one made from the masters that answer. One probe at a time,
/// and none within [`SUSPECT_AFTER`] of the last, so a Redis that is slow for everyone costs
/// about one probe a second, and nothing is replaced while no new connection answers either.
/// A master whose connection the link lacks and that refuses the link's login (its ACL user
/// missing, disabled or with another password there) is noted the same way, with that reason:
/// redis-rs would send its slots' calls to other masters, which redirect them back, until the
/// limit. The replaced connection is dropped once the calls still on it end, and redis-rs then
/// aborts its task and closes its node connections, a stuck one's too (a test freezes every
/// node connection several times over and counts tasks and sockets).
#[derive(Clone)]
pub struct ClusterLink(Arc<LinkInner>);

impl fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterLink")
    }
}

/// Makes the client of a Cluster connection from the nodes to start from (the same settings
/// whatever the nodes).
type Builder = dyn Fn(Vec<redis::ConnectionInfo>) -> redis::cluster::ClusterClientBuilder + Send + Sync;

struct LinkInner {
    /// The seeds, as given.
    seeds: Vec<redis::ConnectionInfo>,
    builder: Box<Builder>,
    conn: RwLock<ClusterConnection>,
    probing: AtomicBool,
    /// When the last probe ended (milliseconds since `born`).
    probed_at: std::sync::atomic::AtomicU64,
    born: Instant,
    /// Every node `CLUSTER SLOTS` listed when the probe last read it (masters and replicas),
    /// as the seeds' settings reach them.
    known: RwLock<Vec<redis::ConnectionInfo>>,
    /// What the last probe saw of the masters that do not accept connections (calls waiting
    /// on it are woken by each new finding).
    down: tokio::sync::watch::Sender<Option<Arc<Down>>>,
}

/// The masters a probe could not open a TCP connection to, with their slots.
struct Down {
    /// When the probe began to look.
    seen: Instant,
    ranges: Vec<SlotRange>,
    /// Why each master of `ranges` cannot be reached.
    why: Vec<(Node, String)>,
    /// The masters that accepted a connection, as the seeds' settings reach them.
    up: Vec<redis::ConnectionInfo>,
}

impl Down {
    /// Why `master` cannot be reached.
    fn why(&self, master: &Node) -> &str {
        self.why.iter().find(|(n, _)| n == master).map_or("cannot be reached", |(_, w)| w.as_str())
    }
}

/// What the probe found of a master.
enum Health {
    /// It does not accept a TCP connection.
    Closed,
    /// It accepts one, and refuses the link's login (why).
    RefusesLogin(String),
    /// It accepts one; `stale` when it answers while what the connection routes to its slots
    /// does not.
    Up { stale: bool },
}

/// Whether `e`, from logging in to one node on a connection of its own, is a login refused (an
/// authentication failure, or an ACL user that may not log in). Asked of a plain connection:
/// a Cluster connection's failure to connect carries only the text of the node's.
fn login_refused(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// How long a Cluster call waits for its answer before its connection is probed.
pub const SUSPECT_AFTER: Duration = Duration::from_secs(1);
/// How long a probe waits for a `PING`'s answer (and for a new connection).
pub const PROBE_LIMIT: Duration = Duration::from_secs(2);

impl ClusterLink {
    /// Connects through `seeds` with the client `builder` makes (with redis-rs's retries off:
    /// see [`cluster_call`](crate::cluster_call)). A replacement connection is made by `builder` too, from the
    /// seeds or from the masters that answer.
    pub async fn connect(
        seeds: Vec<redis::ConnectionInfo>,
        builder: impl Fn(Vec<redis::ConnectionInfo>) -> redis::cluster::ClusterClientBuilder + Send + Sync + 'static,
    ) -> redis::RedisResult<Self> {
        let conn = builder(seeds.clone()).build()?.get_async_connection().await?;
        let link = ClusterLink(Arc::new(LinkInner {
            seeds,
            builder: Box::new(builder),
            conn: RwLock::new(conn),
            probing: AtomicBool::new(false),
            probed_at: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
            known: RwLock::new(Vec::new()),
            down: tokio::sync::watch::Sender::new(None),
        }));
        // The nodes beyond the seeds, known from the start: a later probe may find the seeds
        // paused.
        link.read_slots(&link.0.seeds.iter().filter_map(node_of).collect::<Vec<_>>()).await;
        Ok(link)
    }

    /// The connection in use now (a handle: cheap to clone).
    pub fn current(&self) -> ClusterConnection {
        self.0.conn.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Runs `f` on the connection in use; still waiting after [`SUSPECT_AFTER`], it has the
    /// connection probed (and goes on waiting).
    pub async fn with<T, F: Future<Output = T>>(&self, f: impl FnOnce(ClusterConnection) -> F) -> T {
        let call = f(self.current());
        let mut call = std::pin::pin!(call);
        tokio::select! {
            out = &mut call => out,
            () = tokio::time::sleep(SUSPECT_AFTER) => {
                self.suspect();
                call.await
            }
        }
    }

    /// Probes the connection in the background, unless a probe runs or one ended less than
    /// [`SUSPECT_AFTER`] ago.
    pub fn suspect(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let now = self.0.born.elapsed().as_millis() as u64;
        if now < self.0.probed_at.load(Ordering::Acquire) + SUSPECT_AFTER.as_millis() as u64
            || self.0.probing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let link = self.clone();
        runtime.spawn(async move {
            link.probe().await;
            link.0.probed_at.store(link.0.born.elapsed().as_millis() as u64, Ordering::Release);
            link.0.probing.store(false, Ordering::Release);
        });
    }

    async fn probe(&self) {
        let nodes = self.candidates();
        let routes: Vec<Node> = nodes.iter().filter_map(node_of).collect();
        // Every node at once, not one at random: a paused node answers nothing, and the
        // connection is stuck only when no node answers through it.
        if self.first_answer(ping(), &routes, answered).await.is_none() {
            let why = format!("no node answered a PING through it within {} ms", PROBE_LIMIT.as_millis());
            self.replace(nodes, &why).await;
            return;
        }
        if let Some(why) = self.check_masters(&routes).await {
            // Seeded by the masters that answer: a paused seed would hold up the new
            // connection until its connect timeout.
            let masters = self.0.down.borrow().as_ref().map(|d| d.up.clone()).unwrap_or_default();
            self.replace(masters, &why).await;
        }
    }

    /// The seeds and every node the Cluster listed when last asked, once each: with the
    /// seeds paused, the others (a replica promoted since, say) can still answer.
    fn candidates(&self) -> Vec<redis::ConnectionInfo> {
        let mut nodes = self.0.seeds.clone();
        for n in self.0.known.read().unwrap_or_else(PoisonError::into_inner).iter() {
            if !nodes.iter().any(|s| s.addr() == n.addr()) {
                nodes.push(n.clone());
            }
        }
        nodes
    }

    /// The first of `nodes`' answers to `cmd` through the connection that `accept` takes,
    /// all asked at once, each within [`PROBE_LIMIT`]; `None` when none comes.
    async fn first_answer(&self, cmd: redis::Cmd, nodes: &[Node], accept: fn(&Answer) -> bool) -> Option<Answer> {
        let mut asks = tokio::task::JoinSet::new();
        for node in nodes {
            let (mut conn, cmd, to) = (self.current(), cmd.clone(), RoutingInfo::SingleNode(node.route()));
            asks.spawn(async move { tokio::time::timeout(PROBE_LIMIT, conn.route_command(cmd, to)).await });
        }
        while let Some(joined) = asks.join_next().await {
            if let Ok(answer) = joined
                && accept(&answer)
            {
                return Some(answer);
            }
        }
        None
    }

    /// Reads `CLUSTER SLOTS` (from whichever of `nodes` answers first) into the nodes known.
    async fn read_slots(&self, nodes: &[Node]) -> Option<redis::Value> {
        let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let Ok(Ok(reply)) = self.first_answer(slots, nodes, |a| matches!(a, Ok(Ok(_)))).await? else { return None };
        let listed = listed_nodes(&reply).iter().filter_map(|n| self.settings_for(n)).collect();
        *self.0.known.write().unwrap_or_else(PoisonError::into_inner) = listed;
        Some(reply)
    }

    /// The connection settings for `node`: the seeds', at its address.
    fn settings_for(&self, node: &Node) -> Option<redis::ConnectionInfo> {
        with_address(self.0.seeds.first()?, &node.to_string())
    }

    /// Puts a new connection in place of the current one, made from those of `nodes` that
    /// answer a PING of their own (when none does in time, a loaded machine, from all of them
    /// and the seeds), once it answers a PING too.
    async fn replace(&self, nodes: Vec<redis::ConnectionInfo>, why: &str) {
        let mut live = tokio::task::JoinSet::new();
        for node in nodes.clone() {
            live.spawn(async move {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(PROBE_LIMIT / 2))
                    .set_response_timeout(Some(PROBE_LIMIT / 2));
                let client = redis::Client::open(node.clone()).ok()?;
                let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.ok()?;
                ping().query_async::<redis::Value>(&mut conn).await.ok().map(|_| node)
            });
        }
        let mut seeds = Vec::new();
        while let Some(joined) = live.join_next().await {
            if let Ok(Some(node)) = joined {
                seeds.push(node);
            }
        }
        if seeds.is_empty() {
            seeds = self.0.seeds.clone();
            seeds.extend(nodes.into_iter().filter(|n| !self.0.seeds.iter().any(|s| s.addr() == n.addr())));
        }
        let Ok(client) = (self.0.builder)(seeds).build() else { return };
        let Ok(Ok(mut fresh)) = tokio::time::timeout(2 * PROBE_LIMIT, client.get_async_connection()).await else {
            tracing::debug!("the Redis Cluster connection needs replacing ({why}), but no new one could be made");
            return;
        };
        let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        if !matches!(tokio::time::timeout(PROBE_LIMIT, fresh.route_command(ping(), any)).await, Ok(Ok(_))) {
            return;
        }
        *self.0.conn.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        tracing::warn!("replaced the Redis Cluster connection: {why}");
    }

    /// Reads the masters from the first of `nodes` to answer (`CLUSTER SLOTS`) and notes which
    /// do not accept a TCP connection now (killed, or their machine gone; a paused one still
    /// does: its kernel accepts for it): redis-rs keeps a call for such a master waiting until
    /// its time limit.
    /// Returns why the connection must be replaced when, for a master that answers, a command
    /// routed by the connection to one of its slots gets no answer: its slot map is stale (a
    /// failover while the old master was paused, which redis-rs does not notice: it hears no
    /// MOVED from a node that does not answer).
    async fn check_masters(&self, nodes: &[Node]) -> Option<String> {
        let seen = Instant::now();
        let ranges = slot_ranges(&self.read_slots(nodes).await?)?;
        let mut masters: Vec<(Node, u16)> = Vec::new();
        for r in &ranges {
            if !masters.iter().any(|(m, _)| m == &r.master) {
                masters.push((r.master.clone(), r.first));
            }
        }
        let mut checks = tokio::task::JoinSet::new();
        for (node, slot) in masters {
            let (mut conn, link) = (self.current(), self.clone());
            checks.spawn(async move {
                let open = tokio::net::TcpStream::connect((node.host.as_str(), node.port));
                if !matches!(tokio::time::timeout(PROBE_LIMIT, open).await, Ok(Ok(_))) {
                    return (node, Health::Closed);
                }
                // The master answers, by its own connection (or has none here yet)...
                let to_node = RoutingInfo::SingleNode(node.route());
                let direct = tokio::time::timeout(PROBE_LIMIT, conn.route_command(ping(), to_node)).await;
                let unknown = matches!(&direct, Ok(Err(e)) if e.kind() == ErrorKind::ClusterConnectionNotFound);
                if !answered(&direct) && !unknown {
                    return (node, Health::Up { stale: false });
                }
                // No connection to it: redis-rs may be unable to log in there (the node
                // refuses the user), and then sends its slots' calls to other masters, which
                // redirect them back, until their limit.
                if unknown && let Some(why) = link.refused_login(&node).await {
                    return (node, Health::RefusesLogin(why));
                }
                // ... while what the connection routes to its slot does not.
                let route = Route::new(slot, SlotAddr::Master);
                let to_slot = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let myid = redis::cmd("CLUSTER").arg("MYID").to_owned();
                let stale = !answered(&tokio::time::timeout(PROBE_LIMIT, conn.route_command(myid, to_slot)).await);
                (node, Health::Up { stale })
            });
        }
        let (mut why, mut up, mut stale) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(Ok((node, health))) = checks.join_next().await {
            match health {
                Health::Closed => why.push((node, String::from("does not accept connections"))),
                Health::RefusesLogin(e) => why.push((node, format!("refuses the login ({e})"))),
                Health::Up { stale: routed_nowhere } => {
                    if routed_nowhere {
                        stale.push(node.to_string());
                    }
                    if let Some(info) = self.settings_for(&node) {
                        up.push(info);
                    }
                }
            }
        }
        let ranges = ranges.into_iter().filter(|r| why.iter().any(|(n, _)| n == &r.master)).collect();
        self.0.down.send_replace(Some(Arc::new(Down { seen, ranges, why, up })));
        (!stale.is_empty()).then(|| {
            format!(
                "the Cluster says {} serve(s) slots the connection sent to a node that did not answer within {} ms (a failover it did not follow)",
                stale.join(", "),
                PROBE_LIMIT.as_millis()
            )
        })
    }

    /// Why `node` refuses a connection made as this link's are (the seeds' user, password,
    /// TLS), if it does: a login refused (an ACL user missing, disabled or with another password
    /// there).
    async fn refused_login(&self, node: &Node) -> Option<String> {
        let client = redis::Client::open(self.settings_for(node)?).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(PROBE_LIMIT))
            .set_response_timeout(Some(PROBE_LIMIT));
        let login = client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(PROBE_LIMIT, login).await {
            Ok(Err(e)) if login_refused(&e) => Some(e.to_string()),
            _ => None,
        }
    }

    /// Resolves, naming it, once a probe begun after `began` has found that the master `cmd`
    /// goes to (`at`, else its first key's) does not accept connections; never otherwise (the
    /// caller's own time limit ends the wait). Looks only after [`SUSPECT_AFTER`], as the
    /// probe does.
    pub(crate) async fn unreachable_target(&self, cmd: &redis::Cmd, at: Option<&Node>, began: Instant) -> String {
        tokio::time::sleep(SUSPECT_AFTER.saturating_sub(began.elapsed())).await;
        let mut findings = self.0.down.subscribe();
        let mut slot = None;
        loop {
            let latest = findings.borrow_and_update().clone();
            // Only what a probe saw since the call began: the master may be back.
            if let Some(down) = latest.filter(|d| d.seen >= began && !d.ranges.is_empty()) {
                let hit = match at {
                    Some(node) => down
                        .ranges
                        .iter()
                        .find(|r| &r.master == node)
                        .map(|r| format!("{} {}", r.master, down.why(&r.master))),
                    None => {
                        if slot.is_none() {
                            slot = Some(self.slot_of(cmd).await);
                        }
                        slot.flatten().and_then(|s| {
                            down.ranges
                                .iter()
                                .find(|r| (r.first..=r.last).contains(&s))
                                .map(|r| format!("{}, the master of slot {s}, {}", r.master, down.why(&r.master)))
                        })
                    }
                };
                if let Some(why) = hit {
                    return why;
                }
            }
            // A probe (at most one a second), then its finding; asked again a second later
            // when none came (one was under way, or had just ended, when this call asked).
            self.suspect();
            let _ = tokio::time::timeout(SUSPECT_AFTER, findings.changed()).await;
        }
    }

    /// The slot of `cmd`'s first key, as the Cluster reckons it (`COMMAND GETKEYS`, then
    /// `CLUSTER KEYSLOT`: Redis's own key positions for any command); `None` without a key
    /// or an answer.
    async fn slot_of(&self, cmd: &redis::Cmd) -> Option<u16> {
        // Asked of every node known, the first answer taken: the one picked at random may be
        // the master that is down, or a paused one.
        let nodes: Vec<Node> = self.candidates().iter().filter_map(node_of).collect();
        let ok = |a: &Answer| matches!(a, Ok(Ok(_)));
        let keys = self.first_answer(getkeys(cmd)?, &nodes, ok).await?.ok()?.ok()?;
        let keyslot = redis::cmd("CLUSTER").arg("KEYSLOT").arg(first_key(keys)?).to_owned();
        match self.first_answer(keyslot, &nodes, ok).await?.ok()?.ok()? {
            redis::Value::Int(n) => u16::try_from(n).ok(),
            _ => None,
        }
    }
}

/// The probe's PING (named, so it can be told apart in MONITOR and the slow log).
fn ping() -> redis::Cmd {
    let mut c = redis::cmd("PING");
    c.arg("redcount-probe");
    c
}

/// A call's outcome within a time limit.
type Answer = Result<redis::RedisResult<redis::Value>, tokio::time::error::Elapsed>;

/// Whether Redis answered: a reply, an error reply too; redis-rs's own "timed out" (its
/// response timeout), a lost connection or no connection is not an answer.
fn answered(r: &Answer) -> bool {
    matches!(r, Ok(Ok(_))) || matches!(r, Ok(Err(e)) if e.code().is_some())
}
