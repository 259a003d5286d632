//! The script watchdog: kills any script that runs past `--script-timeout-ms`, from a
//! connection of its own, at all times.
//!
//! Not tied to the request that sent a script: a pipeline or `/multi-exec` of several runaway
//! scripts keeps Redis busy script after script, long after its own request has timed out,
//! and a script may start late behind slow commands queued before it. The front has lowered
//! Redis's `busy-reply-threshold` to the same bound, so on this Redis no script may run longer.
//!
//! A `SCRIPT KILL` sent while a script is younger than the threshold waits in Redis until the
//! script reaches it, so a runaway is killed at its bound whenever the last poll went out;
//! when none runs, Redis answers NOTBUSY at once. Four polls a second cost Redis nothing
//! measurable.

use std::time::{Duration, Instant};

use crate::backend::{Backend, Failed};

/// Kills scripts past `bound` until the process ends.
pub(crate) async fn run(conn: Backend, bound: Duration) {
    let mut unkillable_logged: Option<Instant> = None;
    loop {
        for kind in ["SCRIPT", "FUNCTION"] {
            let mut kill = redis::cmd(kind);
            kill.arg("KILL");
            // On a Cluster the nodes' answers come back as values, a NOTBUSY among them (it
            // was read as "killed", and logged four times a second).
            let answer = conn.query(&kill).await.and_then(|v| v.extract_error().map_err(Failed::Redis));
            match answer {
                Ok(_) => tracing::info!("killed a script that ran past --script-timeout-ms ({} ms)", bound.as_millis()),
                Err(Failed::Redis(e)) if e.code() == Some("UNKILLABLE") => {
                    if unkillable_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::error!(
                            "a script has run past --script-timeout-ms but has written, so Redis cannot kill it: {e}"
                        );
                        unkillable_logged = Some(Instant::now());
                    }
                }
                Err(_) => {} // NOTBUSY: nothing runs (or Redis is away: the next poll reconnects)
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
