//! A Redis Cluster behind the front: calls through [`redcount_cluster`]'s one sender, their
//! outcomes as [`Failed`], and transactions.

use std::sync::Arc;
use std::time::Duration;

use redcount_cluster::{ClusterLink, Hop, Lanes, Node, ReplicaWait, Stop};
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::{Conns, Failed, Login, Waits, logged_in};

/// The Cluster connections of a backend: one for every call, and with a replica wait
/// [`redcount_cluster::WAIT_LANES`] more for the calls that wait.
pub(super) async fn connect(
    url: &str,
    login: Option<&Login>,
    connect_timeout: Duration,
    timeout: Duration,
    wait: Option<ReplicaWait>,
) -> RedisResult<(Conns, Option<Waits>)> {
    // The login goes in the seeds' settings, so the link's own connections to one node (its
    // probe of a node that refuses the login) log in as its Cluster connection does.
    let seeds = url
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.into_connection_info().map(|info| logged_in(info, login)))
        .collect::<RedisResult<Vec<_>>>()?;
    let builder = move |nodes: Vec<redis::ConnectionInfo>| {
        ClusterClientBuilder::new(nodes)
            .connection_timeout(connect_timeout)
            .response_timeout(timeout)
            // No resending by redis-rs: it would send a command again after a lost reply (a
            // write twice), and a whole pipeline again after one entry's ASK (the entries that
            // had run, twice). Redirections are followed by `cluster_call`.
            .retries(0)
    };
    let mut lanes = Vec::new();
    for _ in wait.iter().flat_map(|_| 0..redcount_cluster::WAIT_LANES) {
        lanes.push(ClusterLink::connect(seeds.clone(), builder).await?);
    }
    let waits = wait.map(|wait| Waits { wait, lanes: Some(Arc::new(Lanes::new(lanes))) });
    Ok((Conns::Cluster(ClusterLink::connect(seeds, builder).await?, timeout), waits))
}

/// [`redcount_cluster::cluster_call`], its outcome as the front's. It ends a moment before the
/// front's own limit, so a Cluster that answered only CLUSTERDOWN or TRYAGAIN all along is
/// answered as such (503), not as no answer (504).
pub(super) async fn call(conn: &ClusterLink, cmd: &Cmd, timeout: Duration) -> Result<Value, Failed> {
    stopped(redcount_cluster::cluster_call(conn, cmd, inside(timeout)).await)
}

/// [`call`] with `WAIT` right after the command, in the same write to the node that runs it:
/// both replies (what WAIT's means is the plan's to say).
pub(super) async fn call_waited(
    conn: &ClusterLink,
    cmd: &Cmd,
    wait: &ReplicaWait,
    timeout: Duration,
) -> Result<(Value, Value), Failed> {
    let answered =
        redcount_cluster::cluster_call_via(conn, cmd, Hop::Key, inside(timeout), Some(&wait.command())).await;
    stopped(answered.map(|(reply, waited)| (reply, waited.unwrap_or(Value::Nil))))
}

/// A Cluster call's limit inside the front's own (see [`call`]).
fn inside(timeout: Duration) -> Duration {
    timeout.saturating_sub(Duration::from_millis(50)).max(timeout / 2)
}

/// A Cluster call's outcome as the front's.
fn stopped<T>(outcome: Result<T, Stop>) -> Result<T, Failed> {
    match outcome {
        Ok(v) => Ok(v),
        // Refused: nothing was sent, so it may be sent again.
        Err(Stop::Failed(e)) if e.is_connection_refusal() => Err(Failed::Refused(e)),
        Err(Stop::Failed(e)) => Err(Failed::Redis(e)),
        // Not Redis's MOVED as the client's error (400): the Cluster could not serve it in time.
        Err(Stop::Redirected(e)) => Err(Failed::Redirected(e)),
        Err(Stop::TimedOut) => Err(Failed::TimedOut),
        Err(Stop::Unreachable(why)) => Err(Failed::Unreachable(why)),
        Err(Stop::NotDurable(why)) => Err(Failed::NotDurable(why)),
    }
}

/// Where the first key of `cmd` is now, when its slot is being migrated and the key has left
/// for the importing node: its master answers ASK naming that node (a plain answer while the
/// key is still there). A transaction Redis discarded whole (EXECABORT: each queued command
/// was answered ASK) is sent there once after ASKING ([`transaction_at`]).
pub(super) async fn asked_node(link: &ClusterLink, cmd: &Cmd) -> Option<Node> {
    let getkeys = redcount_cluster::getkeys(cmd)?;
    let keys = link.with(async |mut c| c.req_packed_command(&getkeys).await).await.ok()?;
    let exists = redis::cmd("EXISTS").arg(redcount_cluster::first_key(keys)?).to_owned();
    let Err(asked) = link.with(async |mut c| c.req_packed_command(&exists).await).await else { return None };
    if asked.kind() != ErrorKind::Server(ServerErrorKind::Ask) {
        return None;
    }
    Node::parse(asked.redirect_node()?.0)
}

/// `pipe` as a transaction sent to `node` after ASKING, in the same write (ASKING holds through
/// MULTI … EXEC), where Redis runs it if it has every key it names: its replies; `None` when
/// refused whole there too (a key still on the other node: TRYAGAIN; a command refused when
/// queued: EXECABORT), so nothing ran.
pub(super) async fn transaction_at(
    link: &ClusterLink,
    pipe: &Pipeline,
    node: &Node,
) -> Result<Option<Vec<Value>>, Failed> {
    let mut there = redis::pipe();
    there.cmd("ASKING").cmd("MULTI");
    for c in pipe.cmd_iter() {
        there.add_command(c.clone());
    }
    there.cmd("EXEC");
    let n = pipe.cmd_iter().count();
    let route = SingleNodeRoutingInfo::ByAddress { host: node.host.clone(), port: node.port };
    let exec = link.with(async |mut c| c.route_pipeline(there, n + 2, 1, route).await).await;
    match exec.map(|mut v| v.pop()) {
        Ok(Some(Value::Array(items))) => Ok(Some(items)),
        Ok(Some(Value::ServerError(_))) => Ok(None),
        Err(e) if e.code().is_some() => Ok(None),
        // The answer was lost: it may have run, so it is not sent again.
        Err(e) => Err(Failed::Redis(e)),
        Ok(other) => Err(Failed::Redis(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "unexpected EXEC reply",
            format!("{other:?}"),
        )))),
    }
}
