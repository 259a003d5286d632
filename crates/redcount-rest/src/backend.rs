//! The connections to Redis: a few auto-reconnecting multiplexed connections, or a cluster
//! connection that routes by slot and follows MOVED/ASK.
//!
//! Several connections, not one: a slow command (a long script) then holds up only the
//! requests that share its connection, and the front's own SCRIPT KILL has a way in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisResult, Value};

/// Who a backend logs in as; `None` is the URL's own user.
#[derive(Clone)]
pub struct Login {
    pub user: String,
    pub password: String,
}

pub struct Backend {
    conns: Conns,
    /// For connections logged in as a front-made user: the ACL SETUSER that makes it, and
    /// the URL-user connections to send it on. A restarted Redis has forgotten the user
    /// (unless it saved its ACL), so a refused login is answered by making it again.
    restore: Option<(Cmd, Conns)>,
}

#[derive(Clone)]
enum Conns {
    Single(Arc<Pool>),
    Cluster(ClusterConnection),
}

/// Auto-reconnecting connections to one Redis, used in turn.
struct Pool {
    slots: Vec<RwLock<ConnectionManager>>,
    next: AtomicUsize,
    client: redis::Client,
    config: ConnectionManagerConfig,
}

impl Pool {
    /// Slot `again` (a retry goes where the connection was remade), else the next in turn.
    fn pick(&self, again: Option<usize>) -> (usize, ConnectionManager) {
        let i = again.unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed)) % self.slots.len();
        (i, self.slots[i].read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// A new connection in slot `i`: redis-rs's manager never reconnects after a refused
    /// login (it is not an I/O error), so a slot whose login was refused is replaced.
    async fn replace(&self, i: usize) -> RedisResult<()> {
        let fresh = ConnectionManager::new_with_config(self.client.clone(), self.config.clone()).await?;
        *self.slots[i].write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }
}

/// The command was never sent: the connection was refused, or was already closed (Redis
/// restarted, or closed it idle): redis-rs answers BrokenPipe for a connection whose reader has ended, and
/// the new Redis process never saw the old connection. Safe to send once more, reconnected.
fn known_dead(e: &redis::RedisError) -> bool {
    e.is_connection_refusal() || e.is_io_error() && e.to_string().to_ascii_lowercase().contains("broken pipe")
}

fn login_refused(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM")) && e.to_string().contains("user")
}

impl Backend {
    /// Has the user made again by `setuser`, sent with `setup`'s connections, whenever Redis
    /// refuses this backend's login.
    pub fn restore_with(mut self, setuser: Cmd, setup: &Backend) -> Self {
        self.restore = Some((setuser, setup.conns.clone()));
        self
    }

    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (mut tries, mut slot) = (0, None);
        loop {
            let (used, result) = self.conns.query(cmd, slot).await;
            slot = Some(used);
            match result {
                Err(e) if tries < 3 && self.retry(&e, used).await => tries += 1,
                other => return other,
            }
        }
    }

    /// Runs a pipeline whose per-command errors come back inline (`ignore_errors`).
    pub async fn pipeline(&self, pipe: &Pipeline) -> RedisResult<Value> {
        let (mut tries, mut slot) = (0, None);
        loop {
            let (used, result) = self.conns.pipeline(pipe, slot).await;
            slot = Some(used);
            match result {
                Err(e) if tries < 3 && self.retry(&e, used).await => tries += 1,
                other => return other,
            }
        }
    }

    /// Whether a failed call may be sent again: it never reached Redis (a connection known
    /// dead; a login refused, once the user is made again and the connection replaced).
    async fn retry(&self, e: &redis::RedisError, slot: usize) -> bool {
        if known_dead(e) {
            return true;
        }
        match (&self.restore, &self.conns) {
            (Some((setuser, via)), conns) if login_refused(e) => {
                let made = match via.query(setuser, None).await {
                    (at, Err(e)) if known_dead(&e) => via.query(setuser, Some(at)).await.1,
                    (_, r) => r,
                };
                if made.is_err() {
                    return false;
                }
                match conns {
                    Conns::Single(pool) => pool.replace(slot).await.is_ok(),
                    Conns::Cluster(_) => true,
                }
            }
            _ => false,
        }
    }

    /// Connects and checks with PING, so a wrong URL fails at start, not at the first request.
    pub async fn connect(
        url: &str,
        cluster: bool,
        timeout: Duration,
        login: Option<&Login>,
        connections: usize,
    ) -> RedisResult<Self> {
        let connect_timeout = Duration::from_secs(2);
        let backend = if cluster {
            let seeds: Vec<String> = url.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            let mut builder = ClusterClientBuilder::new(seeds)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout)
                // A migrating slot can answer ASK, then TRYAGAIN, more than once: room to follow.
                .retries(8);
            if let Some(l) = login {
                builder = builder.username(&l.user).password(&l.password);
            }
            Conns::Cluster(builder.build()?.get_async_connection().await?)
        } else {
            let mut info = url.into_connection_info()?;
            if let Some(l) = login {
                let settings = info.redis_settings().clone().set_username(&l.user).set_password(&l.password);
                info = info.set_redis_settings(settings);
            }
            let client = redis::Client::open(info)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            let mut slots = Vec::with_capacity(connections.max(1));
            for _ in 0..connections.max(1) {
                slots.push(RwLock::new(ConnectionManager::new_with_config(client.clone(), config.clone()).await?));
            }
            Conns::Single(Arc::new(Pool { slots, next: AtomicUsize::new(0), client, config }))
        };
        backend.query(&redis::cmd("PING"), None).await.1?;
        Ok(Backend { conns: backend, restore: None })
    }
}

impl Conns {
    /// The reply, and the pool slot that sent it.
    async fn query(&self, cmd: &Cmd, again: Option<usize>) -> (usize, RedisResult<Value>) {
        match self {
            Conns::Single(pool) => {
                let (i, mut c) = pool.pick(again);
                (i, cmd.query_async(&mut c).await)
            }
            Conns::Cluster(c) => (0, cmd.query_async(&mut c.clone()).await),
        }
    }

    async fn pipeline(&self, pipe: &Pipeline, again: Option<usize>) -> (usize, RedisResult<Value>) {
        match self {
            Conns::Single(pool) => {
                let (i, mut c) = pool.pick(again);
                (i, pipe.query_async(&mut c).await)
            }
            Conns::Cluster(c) => (0, pipe.query_async(&mut c.clone()).await),
        }
    }
}

/// A Redis URL with any password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    url.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***@{}", &u[..s], &u[at + 1..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(super::redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(super::redact("redis://u:p@a:1,redis://b:2"), "redis://***@a:1,redis://b:2");
        assert_eq!(super::redact("redis://h:1"), "redis://h:1");
    }
}
