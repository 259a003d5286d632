//! Writes acknowledged only once replicas have them, and the connections they wait on.

use std::sync::PoisonError;
use std::time::Duration;

/// Calls of one of redcount's money scripts (counters, red packets: `EVALSHA` of their SHA,
/// or `EVAL` of their source) are the ones a [`ReplicaWait`] applies to.
pub fn waits_for_replicas(cmd: &redis::Cmd) -> bool {
    use redcount_core::script::{COUNTER, REDPACKET_CREATE, REDPACKET_GRAB};
    static SOURCES: std::sync::LazyLock<[String; 3]> =
        std::sync::LazyLock::new(|| [COUNTER.source(), REDPACKET_CREATE.source(), REDPACKET_GRAB.source()]);
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(first))) = (args.next(), args.next()) else {
        return false;
    };
    if name.eq_ignore_ascii_case(b"EVALSHA") {
        [&COUNTER, &REDPACKET_CREATE, &REDPACKET_GRAB].iter().any(|s| s.sha1().as_bytes().eq_ignore_ascii_case(first))
    } else if name.eq_ignore_ascii_case(b"EVAL") {
        SOURCES.iter().any(|s| s.as_bytes() == first)
    } else {
        false
    }
}

/// Writes acknowledged only once replicas have them (`redcount serve --wait-replicas`,
/// the front's `--wait-replicas`). Redis acknowledges a write once its master has it and
/// replicates it afterwards, so a failover loses what the replica that took over had not
/// received: a master paused past its failover acknowledged writes queued for it when it went
/// on, then dropped them on learning it had been demoted. With a wait,
/// `WAIT replicas timeout` follows each money call on its connection, and a call that fewer
/// replicas acknowledged in time ends not durable: it happened on the master, and may be lost.
///
/// ```
/// use redcount_cluster::ReplicaWait;
/// let wait = ReplicaWait { replicas: 1, timeout: std::time::Duration::from_millis(250) };
/// assert!(wait.check(&redis::Value::Int(1)).is_ok());
/// assert_eq!(
///     wait.check(&redis::Value::Int(0)).unwrap_err(),
///     "the write happened on the master, but 0 of 1 replica acknowledged it within 250 ms: \
///      it may be lost if the master fails over"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// Replicas that must acknowledge the write.
    pub replicas: u32,
    /// The most a call waits for them (WAIT's timeout, at least 1 ms: 0 would wait forever).
    pub timeout: Duration,
}

impl ReplicaWait {
    /// `WAIT replicas timeout`.
    pub fn command(&self) -> redis::Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX).max(1));
        wait
    }

    /// `cmd` then `WAIT`, as one pipeline whose error replies come back in place (one write,
    /// so nothing else runs on the connection between them).
    pub fn pipeline(&self, cmd: &redis::Cmd) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors().add_command(cmd.clone()).add_command(self.command());
        pipe
    }

    /// The command's reply and WAIT's, from the reply of [`pipeline`](Self::pipeline).
    pub fn split(&self, replies: redis::Value) -> Result<(redis::Value, redis::Value), String> {
        match replies {
            redis::Value::Array(v) if v.len() == 2 => {
                let mut v = v.into_iter();
                Ok((v.next().unwrap_or(redis::Value::Nil), v.next().unwrap_or(redis::Value::Nil)))
            }
            other => Err(format!("unexpected reply to a call and its WAIT: {other:?}")),
        }
    }

    /// `Ok` when WAIT's reply says enough replicas acknowledged the write; otherwise why not.
    pub fn check(&self, waited: &redis::Value) -> Result<(), String> {
        let wanted = i64::from(self.replicas);
        let plural = if self.replicas == 1 { "replica" } else { "replicas" };
        let not = |what: String| {
            format!(
                "the write happened on the master, but {what} within {} ms: it may be lost if the master fails over",
                self.timeout.as_millis()
            )
        };
        match waited {
            redis::Value::Int(n) if *n >= wanted => Ok(()),
            redis::Value::Int(n) => Err(not(format!("{n} of {wanted} {plural} acknowledged it"))),
            redis::Value::ServerError(e) => Err(not(format!(
                "WAIT for {wanted} {plural} failed ({} {})",
                e.code(),
                e.details().unwrap_or_default()
            ))),
            other => Err(not(format!("WAIT for {wanted} {plural} answered {other:?}"))),
        }
    }
}

/// Connections for calls that wait for replicas, per `redcount::Direct` (and per Cluster
/// backend of the REST front).
pub const WAIT_LANES: usize = 8;

/// Connections (or connection handles) each lent to one call at a time.
#[derive(Debug)]
pub struct Lanes<T> {
    free: std::sync::Mutex<Vec<T>>,
    permits: tokio::sync::Semaphore,
}

impl<T> Lanes<T> {
    /// The lanes `items`.
    pub fn new(items: Vec<T>) -> Self {
        let permits = tokio::sync::Semaphore::new(items.len());
        Lanes { free: std::sync::Mutex::new(items), permits }
    }

    /// A lane of its own, waited for while all are lent; given back on drop.
    pub async fn lease(&self) -> Lent<'_, T> {
        let permit = self.permits.acquire().await.expect("the lanes' semaphore is never closed");
        let item = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        Lent { lanes: self, item, _permit: permit }
    }
}

/// A lane lent by [`Lanes::lease`].
#[derive(Debug)]
pub struct Lent<'a, T> {
    lanes: &'a Lanes<T>,
    item: Option<T>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl<T> std::ops::Deref for Lent<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("a permit means a free lane")
    }
}

impl<T> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.lanes.free.lock().unwrap_or_else(PoisonError::into_inner).push(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_of_money_scripts_wait_for_replicas() {
        use redcount_core::script::ALL;
        let call = |verb: &str, first: &str| redis::cmd(verb).arg(first).arg(1).arg("rc:{c:x:y}").to_owned();
        let money = ["counter", "redpacket_create", "redpacket_grab"];
        for script in ALL {
            let waits = money.contains(&script.name());
            assert_eq!(waits_for_replicas(&call("EVALSHA", script.sha1())), waits, "EVALSHA {}", script.name());
            assert_eq!(waits_for_replicas(&call("evalsha", &script.sha1().to_uppercase())), waits, "{}", script.name());
            assert_eq!(waits_for_replicas(&call("EVAL", &script.source())), waits, "EVAL {}", script.name());
            assert!(!waits_for_replicas(&call("EVALSHA_RO", script.sha1())), "a read-only call never waits");
        }
        assert!(!waits_for_replicas(&redis::cmd("INCR").arg("k").to_owned()));
        assert!(!waits_for_replicas(&redis::cmd("EVAL").to_owned()));
    }

    #[test]
    fn a_wait_is_met_only_by_enough_replicas_answering() {
        let wait = ReplicaWait { replicas: 2, timeout: Duration::from_millis(100) };
        assert_eq!(wait.command().args_iter().count(), 3);
        assert!(wait.check(&redis::Value::Int(2)).is_ok() && wait.check(&redis::Value::Int(3)).is_ok());
        assert_eq!(
            wait.check(&redis::Value::Int(1)).unwrap_err(),
            "the write happened on the master, but 1 of 2 replicas acknowledged it within 100 ms: \
             it may be lost if the master fails over"
        );
        let demoted = redis::parse_redis_value(b"-UNBLOCKED instance state changed (master -> replica?)\r\n").unwrap();
        assert!(matches!(demoted, redis::Value::ServerError(_)));
        assert!(wait.check(&demoted).is_err(), "a WAIT cut short by a demotion is not durable");
        assert!(wait.check(&redis::Value::Nil).is_err());
        let (reply, waited) =
            wait.split(redis::Value::Array(vec![redis::Value::Int(7), redis::Value::Int(2)])).unwrap();
        assert_eq!((reply, waited), (redis::Value::Int(7), redis::Value::Int(2)));
        assert!(wait.split(redis::Value::Int(7)).is_err());
        // Never `WAIT n 0`, which waits forever.
        let zero = ReplicaWait { replicas: 1, timeout: Duration::ZERO };
        let args: Vec<Vec<u8>> = zero
            .command()
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[2], b"1");
    }
}
