//! Runs core operations on Redis directly (RESP, through redis-rs).

use std::fmt;

use redcount_core::{Command, ErrorReply, Operation, Value};

use crate::{Error, Transport};

/// A multiplexed connection to one Redis that reconnects by itself, able to run any core
/// operation.
#[derive(Clone)]
pub struct Direct {
    conn: redis::aio::ConnectionManager,
}

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Direct")
    }
}

impl Direct {
    /// Connects to `url` (`redis://host:port/db`); a call waits at most 5 s for its reply.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, std::time::Duration::from_secs(5)).await
    }

    /// Connects to `url`; a call waits at most `timeout` for its reply.
    pub async fn connect_with(url: &str, timeout: std::time::Duration) -> Result<Self, Error> {
        // RESP3: the manager is told when its connection ends and reconnects at once, so a
        // command is never sent on a connection that died with an old Redis process.
        let mut info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|e| Error::Config(format!("Redis URL {url:?}: {e}")))?;
        let settings = info.redis_settings().clone().set_protocol(redis::ProtocolVersion::RESP3);
        info = info.set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(|e| Error::Config(format!("Redis URL {url:?}: {e}")))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(std::time::Duration::from_millis(500));
        let conn = redis::aio::ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| Error::Transport(transport(&e)))?;
        Ok(Direct { conn })
    }

    /// Sends one command and returns its reply, an error reply as `Err(Error::Redis)`.
    pub async fn send(&self, command: &Command) -> Result<Value, Error> {
        let parts = command.parts();
        let mut cmd = redis::cmd(&parts[0]);
        for a in &parts[1..] {
            cmd.arg(a.as_bytes());
        }
        let mut conn = self.conn.clone();
        let mut result = cmd.query_async::<redis::Value>(&mut conn).await;
        // Refused while Redis was down: nothing was sent and the manager is reconnecting, so
        // send it once more rather than fail the first request after Redis is back. (Never on
        // "broken pipe": redis-rs says that also of a command whose reply was lost after it
        // ran.)
        if let Err(e) = &result
            && e.is_connection_refusal()
        {
            result = cmd.query_async::<redis::Value>(&mut conn).await;
        }
        match result {
            Ok(v) => from_redis(v).map_err(Error::Redis),
            Err(e) => Err(match server_error(&e) {
                Some(reply) => Error::Redis(reply),
                None => Error::Transport(transport(&e)),
            }),
        }
    }

    /// Runs `op` in one round trip (two when the script cache has lost the script).
    pub async fn run<O: Operation + Sync>(&self, op: &O) -> Result<O::Outcome, Error> {
        crate::Driver::run(self, op).await
    }
}

impl crate::Driver for Direct {
    async fn send(&self, command: &Command) -> Result<Value, Error> {
        Direct::send(self, command).await
    }
}

/// What a failed redis-rs call says about the command: refused connections sent nothing;
/// anything else (a timeout, a connection that ended) may have run it.
fn transport(e: &redis::RedisError) -> Transport {
    Transport { may_have_run: !e.is_connection_refusal(), timed_out: e.is_timeout(), detail: format!("Redis: {e}") }
}

/// The error reply inside a redis-rs error, if it is one.
fn server_error(e: &redis::RedisError) -> Option<ErrorReply> {
    let code = e.code()?;
    let detail = e.detail().unwrap_or("");
    Some(ErrorReply::new(if detail.is_empty() { code.to_string() } else { format!("{code} {detail}") }))
}

/// Converts a redis-rs reply to the core's [`Value`]; a nested error reply becomes `Err`.
fn from_redis(v: redis::Value) -> Result<Value, ErrorReply> {
    Ok(match v {
        redis::Value::Nil => Value::Nil,
        redis::Value::Int(n) => Value::Int(n),
        redis::Value::BulkString(b) => Value::Bytes(b),
        redis::Value::SimpleString(s) => Value::Bytes(s.into_bytes()),
        redis::Value::Okay => Value::Bytes(b"OK".to_vec()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Value::Array(items.into_iter().map(from_redis).collect::<Result<_, _>>()?)
        }
        redis::Value::Boolean(b) => Value::Int(b as i64),
        // RESP3 forms (the connection speaks RESP3), as RESP2 would have sent them.
        redis::Value::VerbatimString { text, .. } => Value::Bytes(text.into_bytes()),
        redis::Value::Double(d) => Value::Bytes(d.to_string().into_bytes()),
        redis::Value::Map(pairs) => {
            Value::Array(pairs.into_iter().flat_map(|(k, v)| [from_redis(k), from_redis(v)]).collect::<Result<_, _>>()?)
        }
        redis::Value::ServerError(e) => {
            let msg = match e.details() {
                Some(d) => format!("{} {}", e.code(), d),
                None => e.code().to_string(),
            };
            return Err(ErrorReply::new(msg));
        }
        other => Value::Bytes(format!("{other:?}").into_bytes()),
    })
}

impl Direct {
    /// Whether Redis may evict redcount's keys: `Some(why)` when `maxmemory` is set and
    /// `maxmemory-policy` is not `noeviction` (every redcount key has a TTL, so `volatile-*`
    /// policies evict them too). An evicted claim, quota window or idempotency record breaks
    /// redcount's promises. `None` also when Redis does not let this user read its
    /// configuration (managed Redis): then it cannot be told.
    pub async fn eviction_risk(&self) -> Option<String> {
        let get = |name: &'static str| async move {
            match self.send(&Command::new("CONFIG").arg("GET").arg(name)).await {
                Ok(Value::Array(pair)) => match pair.get(1) {
                    Some(Value::Bytes(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                },
                _ => None,
            }
        };
        let policy = get("maxmemory-policy").await?;
        let max = get("maxmemory").await?;
        (max != "0" && policy != "noeviction")
            .then(|| format!("maxmemory-policy is {policy} with maxmemory {max}: Redis may evict redcount's keys"))
    }
}
