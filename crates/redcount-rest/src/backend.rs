//! The connection to Redis: one auto-reconnecting multiplexed connection, or a cluster
//! connection that routes by slot and follows MOVED/ASK.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisResult, Value};

pub enum Backend {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Backend {
    /// Connects and checks with PING, so a wrong URL fails at start, not at the first request.
    pub async fn connect(url: &str, cluster: bool, timeout: Duration) -> RedisResult<Self> {
        let connect_timeout = Duration::from_secs(2);
        let backend = if cluster {
            let seeds: Vec<String> = url.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
            let client = ClusterClientBuilder::new(seeds)
                .connection_timeout(connect_timeout)
                .response_timeout(timeout)
                // A migrating slot can answer ASK, then TRYAGAIN, more than once: room to follow.
                .retries(8)
                .build()?;
            Backend::Cluster(client.get_async_connection().await?)
        } else {
            let client = redis::Client::open(url)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            Backend::Single(ConnectionManager::new_with_config(client, config).await?)
        };
        backend.query(&redis::cmd("PING")).await?;
        Ok(backend)
    }

    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Backend::Single(c) => cmd.query_async(&mut c.clone()).await,
            Backend::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs a pipeline whose per-command errors come back inline (`ignore_errors`).
    pub async fn pipeline(&self, pipe: &Pipeline) -> RedisResult<Value> {
        match self {
            Backend::Single(c) => pipe.query_async(&mut c.clone()).await,
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
