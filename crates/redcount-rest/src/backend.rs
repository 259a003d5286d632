//! The connections to Redis: a few auto-reconnecting multiplexed connections, or a cluster
//! connection that routes by slot and follows MOVED/ASK.
//!
//! Several connections, not one: a slow command (a long script) then holds up only the
//! requests that share its connection, and the front's own SCRIPT KILL has a way in.

use std::sync::atomic::{AtomicUsize, Ordering};
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

pub enum Backend {
    Single { pool: Vec<ConnectionManager>, next: AtomicUsize },
    Cluster(ClusterConnection),
}

impl Backend {
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
            Backend::Cluster(builder.build()?.get_async_connection().await?)
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
            let mut pool = Vec::with_capacity(connections.max(1));
            for _ in 0..connections.max(1) {
                pool.push(ConnectionManager::new_with_config(client.clone(), config.clone()).await?);
            }
            Backend::Single { pool, next: AtomicUsize::new(0) }
        };
        backend.query(&redis::cmd("PING")).await?;
        Ok(backend)
    }

    fn single(pool: &[ConnectionManager], next: &AtomicUsize) -> ConnectionManager {
        pool[next.fetch_add(1, Ordering::Relaxed) % pool.len()].clone()
    }

    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Backend::Single { pool, next } => cmd.query_async(&mut Self::single(pool, next)).await,
            Backend::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs a pipeline whose per-command errors come back inline (`ignore_errors`).
    pub async fn pipeline(&self, pipe: &Pipeline) -> RedisResult<Value> {
        match self {
            Backend::Single { pool, next } => pipe.query_async(&mut Self::single(pool, next)).await,
            Backend::Cluster(c) => pipe.query_async(&mut c.clone()).await,
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
