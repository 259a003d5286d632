//! One Cluster call: sent again only when Redis answered that it did not run it.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, ServerErrorKind};

use crate::{ClusterLink, Node, ReplicaWait};

/// Where a Cluster call goes next.
#[derive(Debug, Clone)]
pub enum Hop {
    /// To the master of the command's key (redis-rs's slot map).
    Key,
    /// `ASKING`, then the command, to this node (a slot in migration).
    Ask(Node),
    /// To this node, no redirection followed (per-node administration: SCAN, CONFIG GET).
    At(Node),
}

/// How a Cluster call ended without a reply.
#[derive(Debug)]
pub enum Stop {
    /// It failed in a way that does not prove it did not run (a lost connection, a timed-out
    /// reply), or Redis answered an error that retrying does not change; also TRYAGAIN or
    /// CLUSTERDOWN still answered when the time ran out.
    Failed(redis::RedisError),
    /// No answer within the time limit: it may have run.
    TimedOut,
    /// Still redirected (MOVED / ASK) when the time ran out: it did not run.
    Redirected(redis::RedisError),
    /// Still waiting while the master it goes to refuses connections (named here, with its
    /// slot): given up before the time limit. It may have run (sent before that master went
    /// down).
    Unreachable(String),
    /// It ran and Redis answered, but fewer replicas than asked acknowledged its write within
    /// the wait ([`cluster_call_waited`]; why, here): the write may be lost in a failover.
    NotDurable(String),
}

/// Sends `cmd` on a Cluster connection made with redis-rs's own retries off
/// (`ClusterClientBuilder::retries(0)`), to the master of its first key, and sends it again
/// only when Redis answered that it did not run it: `MOVED` (after the slot map is
/// refreshed), `ASK` (`ASKING` and the command to the node named), `TRYAGAIN` and
/// `CLUSTERDOWN` (waited out with short pauses), all within `timeout`. redis-rs's retries
/// would also resend after a lost reply, and a write would run twice. Shared by
/// `redcount::Direct` and the REST front.
pub async fn cluster_call(conn: &ClusterLink, cmd: &redis::Cmd, timeout: Duration) -> Result<redis::Value, Stop> {
    cluster_call_via(conn, cmd, Hop::Key, timeout, None).await.map(|(v, _)| v)
}

/// [`cluster_call`] for a write that must reach replicas: `WAIT` follows the command in the
/// same write to the node that runs it (so it counts the replicas that have that connection's
/// write), and a reply is returned only when `wait` is met; otherwise [`Stop::NotDurable`].
/// An error reply is returned as it is (a script that refuses writes nothing). `conn` should
/// carry no other traffic while this runs: its node connection waits with the `WAIT`.
pub async fn cluster_call_waited(
    conn: &ClusterLink,
    cmd: &redis::Cmd,
    wait: &ReplicaWait,
    timeout: Duration,
) -> Result<redis::Value, Stop> {
    let (reply, waited) = cluster_call_via(conn, cmd, Hop::Key, timeout, Some(&wait.command())).await?;
    // An error reply is the answer, as from `cluster_call` (a script that refuses writes
    // nothing: there is nothing to wait for).
    if let redis::Value::ServerError(e) = reply {
        return Err(Stop::Failed(e.into()));
    }
    wait.check(&waited.unwrap_or(redis::Value::Nil)).map_err(Stop::NotDurable)?;
    Ok(reply)
}

/// [`cluster_call`] starting at `first` (the master of the key, or a node of one's own
/// choosing: per-node administration), also returning `wait`'s reply when given (sent right
/// after the command on the same node connection).
pub async fn cluster_call_via(
    conn: &ClusterLink,
    cmd: &redis::Cmd,
    first: Hop,
    timeout: Duration,
    wait: Option<&redis::Cmd>,
) -> Result<(redis::Value, Option<redis::Value>), Stop> {
    let deadline = Instant::now() + timeout;
    let fixed = matches!(first, Hop::At(_));
    let mut hop = first;
    let mut pause = Duration::from_millis(2);
    // A master that does not accept connections keeps a call for it waiting (redis-rs) or
    // redirected back and forth (it sends it to another master, which answers MOVED to the
    // one that is down) until the time limit: once a probe has seen the master down, the
    // call ends with it named. One watch for the whole call, across its tries.
    let aim = match &hop {
        Hop::At(node) => Some(node.clone()),
        _ => None,
    };
    let watch = conn.unreachable_target(cmd, aim.as_ref(), Instant::now());
    let mut watch = std::pin::pin!(watch);
    // The longest try so far: a try sent again must have that much time left (twice), or the
    // time limit would cut it and turn "did not run" into "may have run".
    let mut longest = Duration::ZERO;
    loop {
        let started = Instant::now();
        let remaining = deadline.saturating_duration_since(started);
        let tried = tokio::time::timeout(remaining, conn.with(|c| attempt(c, cmd, &hop, wait)));
        let e = tokio::select! {
            out = tried => match out {
                Err(_) => return Err(Stop::TimedOut),
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => e,
            },
            why = &mut watch => return Err(Stop::Unreachable(why)),
        };
        // Only a reply from Redis proves the command did not run. Any other failure may come
        // after it was sent (redis-rs also hands in-flight calls the error of a failed
        // slot-map refresh), so it is final and "may have run".
        let (next, wait) = match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) if !fixed => (Hop::Key, true),
            ErrorKind::Server(ServerErrorKind::Ask) if !fixed => {
                match e.redirect_node().and_then(|(addr, _)| Node::parse(addr)) {
                    Some(node) => (Hop::Ask(node), false),
                    None => return Err(Stop::Failed(e)),
                }
            }
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                (if fixed { hop } else { Hop::Key }, true)
            }
            _ => return Err(Stop::Failed(e)),
        };
        longest = longest.max(started.elapsed());
        // MOVED: redis-rs refreshes its slot map; a short pause lets it finish.
        let wait = if wait { pause } else { Duration::ZERO };
        if Instant::now() + wait + 2 * longest >= deadline {
            return Err(match e.kind() {
                // Still unavailable: Redis's own answer.
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => Stop::Failed(e),
                _ => Stop::Redirected(e),
            });
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        hop = next;
    }
}

/// One try of a Cluster call: its reply, and `wait`'s (sent right after it, on the same node
/// connection) when given. An error reply that is not a redirection comes back as a reply
/// (`Value::ServerError`) when the command goes in a pipeline (after ASKING, or with a WAIT).
async fn attempt(
    mut conn: ClusterConnection,
    cmd: &redis::Cmd,
    hop: &Hop,
    wait: Option<&redis::Cmd>,
) -> redis::RedisResult<(redis::Value, Option<redis::Value>)> {
    match (hop, wait) {
        (Hop::Key, None) => conn.req_packed_command(cmd).await.map(|v| (v, None)),
        (Hop::At(node), _) => {
            conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node.route())).await.map(|v| (v, None))
        }
        (Hop::Key, Some(_)) => {
            // A money script's first key (EVALSHA sha numkeys key …) names its slot.
            let Some(redis::Arg::Simple(key)) = cmd.args_iter().nth(3) else {
                return Err(redis::RedisError::from((ErrorKind::Client, "a call that waits for replicas needs a key")));
            };
            let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone());
            on_one_node(conn, pipe, 0, wait, route).await
        }
        (Hop::Ask(node), _) => {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            on_one_node(conn, pipe, 1, wait, node.route()).await
        }
    }
}

/// `pipe` (then `wait`) in one write on one node's connection, so nothing else comes between
/// ASKING and the command, nor between the command and its WAIT; the replies from `offset` on.
async fn on_one_node(
    mut conn: ClusterConnection,
    mut pipe: redis::Pipeline,
    offset: usize,
    wait: Option<&redis::Cmd>,
    route: SingleNodeRoutingInfo,
) -> redis::RedisResult<(redis::Value, Option<redis::Value>)> {
    if let Some(w) = wait {
        pipe.add_command(w.clone());
    }
    let count = 1 + usize::from(wait.is_some());
    let mut replies = conn.route_pipeline(pipe, offset, count, route).await?.into_iter();
    let reply = replies.next().ok_or_else(|| redis::RedisError::from((ErrorKind::Client, "no reply")))?;
    Ok((reply, replies.next()))
}
