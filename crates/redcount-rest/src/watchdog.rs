//! The script watchdog: while scripts the front sent may still be running, it kills any
//! script that passes `--script-timeout-ms`, from a connection of its own.
//!
//! Not tied to the request that sent them: a pipeline or `/multi-exec` of several runaway
//! scripts keeps Redis busy script after script, long after its own request has timed out,
//! so the kills go on until every script it could have started has had its bound.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{backend::Backend, log};

/// When to kill, shared by the requests (which arm it) and the task that kills.
pub(crate) struct Watchdog {
    armed_until: Mutex<Option<Instant>>,
    wake: tokio::sync::Notify,
    bound: Duration,
}

impl Watchdog {
    pub(crate) fn new(bound: Duration) -> Arc<Self> {
        Arc::new(Watchdog { armed_until: Mutex::new(None), wake: tokio::sync::Notify::new(), bound })
    }

    /// A request is sending `scripts` script calls and waits at most `timeout`: watch until
    /// each of them could have run to its bound after that (and a second more).
    pub(crate) fn arm(&self, scripts: usize, timeout: Duration) {
        let n = u32::try_from(scripts).unwrap_or(u32::MAX);
        let until = Instant::now() + timeout + self.bound.saturating_mul(n) + Duration::from_secs(1);
        let mut armed = self.armed_until.lock().unwrap_or_else(|e| e.into_inner());
        if armed.is_none_or(|a| a < until) {
            *armed = Some(until);
        }
        drop(armed);
        self.wake.notify_one();
    }

    fn armed(&self) -> bool {
        let armed = self.armed_until.lock().unwrap_or_else(|e| e.into_inner());
        armed.is_some_and(|a| Instant::now() < a)
    }

    /// Kills scripts past their bound while armed. SCRIPT KILL sent while a script is younger
    /// than `busy-reply-threshold` (the front sets it to the bound) waits for it to get there,
    /// so a runaway script is killed at its bound, not later; when none runs, Redis answers
    /// NOTBUSY at once.
    pub(crate) async fn run(self: Arc<Self>, conn: Backend, level: log::Level) {
        let mut unkillable_logged: Option<Instant> = None;
        loop {
            if !self.armed() {
                tokio::select! {
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            for kind in ["SCRIPT", "FUNCTION"] {
                let mut kill = redis::cmd(kind);
                kill.arg("KILL");
                match conn.query(&kill).await {
                    Ok(_) => log::info(
                        level,
                        &format!("killed a script that ran past --script-timeout-ms ({} ms)", self.bound.as_millis()),
                    ),
                    Err(e) if e.code() == Some("UNKILLABLE") => {
                        if unkillable_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            log::error(&format!(
                                "a script has run past --script-timeout-ms but has written, so Redis cannot kill it: {e}"
                            ));
                            unkillable_logged = Some(Instant::now());
                        }
                    }
                    Err(_) => {} // NOTBUSY: nothing runs
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
