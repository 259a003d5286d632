//! What a request does next, decided apart from doing it.
//!
//! A plan never awaits and never reads a clock: the driver ([`crate::driver`]) hands it the
//! time and the outcome of what it last did, and the plan answers with the next [`Step`]: send
//! this, wait until then, or answer. Every wait for a redirect or a busy Redis, the reload of
//! a rewritten script Redis lost, a pipeline's chunk sizes, a Cluster transaction's ASK
//! follow and resend, what a replica wait's answer means, the reply budget and every "ran
//! past --timeout-ms" message are decided here, and tested below with scripted outcomes and
//! a virtual clock, without Redis.
//!
//! Two plans: [`One`] for a single command, [`Batch`] for a `/pipeline` or a `/multi-exec`.
//! Each is made with the time it starts and answers `start()` with its first step; then, after
//! doing each step, the driver calls `next(now, outcome)` until the step is an answer.

use std::ops::Range;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use redcount_cluster::{Node, ReplicaWait};
use redcount_core::ErrorKind;
use redis::Value;

use crate::failure::{self, Cause, Failure, error, too_large};
use crate::reply;

/// What to do next.
#[derive(Debug)]
pub(crate) enum Step<S, T> {
    /// Do this, then call `next` with its outcome.
    Send(S),
    /// Nothing before this instant; then call `next` with the `Woke` outcome.
    Wait(Instant),
    /// The request's answer: nothing more to do.
    Answer(Result<T, Failure>),
}

/// How long to wait before sending again after a redirect Redis's own budget did not follow
/// (one Redis behind the front: a slot in migration elsewhere): 15 ms more each time, 8 times.
const REDIRECT_PAUSE: Duration = Duration::from_millis(15);
const MAX_REDIRECTS: u32 = 8;
/// How long to wait before sending again after a reply that ran nothing and clears by itself
/// (BUSY while the watchdog kills a script, LOADING after a restart, TRYAGAIN).
const BUSY_PAUSE: Duration = Duration::from_millis(25);
/// A discarded Cluster transaction is sent again only while this much time is left.
const RESEND_MARGIN: Duration = Duration::from_millis(100);
/// The most commands of a pipeline sent at once.
const MAX_CHUNK: usize = 32;

// ---------------------------------------------------------------------------------------
// One command.

/// What a single command's plan sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    /// The command (with `WAIT` after it when it waits for replicas).
    Command,
    /// The script's source again, as EVAL (EVAL_RO for EVALSHA_RO): Redis lost a script the
    /// front knows by its rewritten SHA. The driver checks it as any command first.
    Reload,
}

/// What sending gave a single command's plan.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Redis's answer (an error reply is a failure), and `WAIT`'s reply when the command was
    /// sent with one.
    Answered(Result<Value, Failure>, Option<Value>),
    /// A wait ended.
    Woke,
}

/// A single command's plan.
#[derive(Debug)]
pub(crate) struct One {
    started: Instant,
    timeout: Duration,
    /// On one Redis the front waits out redirects and "not now" replies itself; a Cluster's
    /// sender already does, within the limit (tries here on top took three times the limit
    /// and answered 504 where the Cluster had said why).
    waits_here: bool,
    redirects: u32,
    /// Whether a NOSCRIPT may be answered by sending the script's source (a rewritten script).
    may_reload: bool,
    reloaded: bool,
    /// How replicas must acknowledge the command's write, when it waits for them.
    wait: Option<ReplicaWait>,
}

impl One {
    /// The plan of a command sent at `now`, given `--timeout-ms`, whether Redis is a Cluster,
    /// whether a lost script may be sent again, and the replica wait the command is sent with.
    pub(crate) fn new(
        now: Instant,
        timeout: Duration,
        cluster: bool,
        may_reload: bool,
        wait: Option<ReplicaWait>,
    ) -> Self {
        One { started: now, timeout, waits_here: !cluster, redirects: 0, may_reload, reloaded: false, wait }
    }

    /// The first step: send the command.
    pub(crate) fn start(&self) -> Step<Which, Value> {
        Step::Send(Which::Command)
    }

    /// The step after `outcome`, at `now`.
    pub(crate) fn next(&mut self, now: Instant, outcome: Outcome) -> Step<Which, Value> {
        let (answer, waited) = match outcome {
            Outcome::Woke => return Step::Send(Which::Command),
            Outcome::Answered(answer, waited) => (answer, waited),
        };
        if self.reloaded {
            return Step::Answer(answer);
        }
        if let Err(f) = &answer
            && let Some(pause) = self.pause(f)
            // The last try may run past the limit by up to one limit: a try cut short would be
            // a 504 "may have run" instead of Redis's own "not now".
            && now.saturating_duration_since(self.started) + pause < self.timeout
        {
            return Step::Wait(now + pause);
        }
        if let Err(f) = &answer
            && f.cause == Cause::Reply(ErrorKind::NoScript)
            && self.may_reload
        {
            self.reloaded = true;
            return Step::Send(Which::Reload);
        }
        Step::Answer(match (answer, &self.wait, waited) {
            (Ok(reply), Some(wait), Some(waited)) => durable(wait, reply, &waited),
            (answer, ..) => answer,
        })
    }

    /// How long to wait before sending again after `f`, if at all.
    fn pause(&mut self, f: &Failure) -> Option<Duration> {
        if !self.waits_here {
            return None;
        }
        match f.cause {
            // A slot in migration answers ASK/MOVED once the client's own redirect budget is
            // spent; the migration of one slot takes milliseconds, so follow a little (at most
            // ~0.5 s in all).
            Cause::Reply(ErrorKind::Redirect) if self.redirects < MAX_REDIRECTS => {
                self.redirects += 1;
                Some(REDIRECT_PAUSE * self.redirects)
            }
            Cause::Reply(ErrorKind::Unavailable) => Some(BUSY_PAUSE),
            _ => None,
        }
    }
}

/// A write's reply once `WAIT` answered `waited`: the reply when enough replicas have it,
/// otherwise not durable (it happened on the master and may be lost in a failover).
fn durable(wait: &ReplicaWait, reply: Value, waited: &Value) -> Result<Value, Failure> {
    match wait.check(waited) {
        Ok(()) => Ok(reply),
        Err(why) => Err(failure::not_durable(&why)),
    }
}

// ---------------------------------------------------------------------------------------
// A pipeline or a transaction.

/// What a batch's plan sends, naming its commands by their positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Send {
    /// These commands as one pipeline (a transaction when the batch is one), answered within
    /// `within`.
    Chunk { range: Range<usize>, within: Duration },
    /// This command alone (an entry of a pipeline on a Cluster: each goes to its own master
    /// through the one sender that resends only what Redis said it did not run), within
    /// `within`; with `WAIT` after it when it waits for replicas.
    Entry { at: usize, within: Duration },
    /// Where the first key of the transaction of these commands is now, which Redis discarded
    /// (EXECABORT): the node its master's ASK names while the key has left in a migration.
    Locate { range: Range<usize>, within: Duration },
    /// These commands as a transaction after ASKING, to `node`, in one write.
    Asking { range: Range<usize>, node: Node, within: Duration },
    /// Whether Redis would run each of these commands: it knows it with that many arguments,
    /// and the token's Redis user may run it (ACL DRYRUN), asked within `within`.
    MayRun { range: Range<usize>, within: Duration },
    /// A read of this command's first key, so the Cluster connection learns where its slot
    /// went (a transaction's own MOVED does not teach it).
    Follow { at: usize },
}

/// What a transaction sent after ASKING gave.
#[derive(Debug)]
pub(crate) enum Asked {
    /// It ran there: its replies.
    Ran(Vec<Value>),
    /// Refused whole there too (a key still on the other node: TRYAGAIN; a command refused
    /// when queued: EXECABORT): nothing ran.
    Refused,
    /// No answer (it may have run), or an answer of another shape.
    Failed(Failure),
}

/// What doing a batch's step gave.
#[derive(Debug)]
pub(crate) enum BatchOutcome {
    /// A chunk's replies, `None` when nothing was sent because its keys span Cluster slots.
    Chunk(Result<Option<Value>, Failure>),
    /// An entry's reply (an error reply as a value: that entry's answer), and `WAIT`'s reply
    /// when it was sent with one.
    Entry(Result<Value, Failure>, Option<Value>),
    /// The node an ASK named for the transaction's first key, if any did (a failure: no
    /// answer in time).
    Located(Result<Option<Node>, Failure>),
    /// What the transaction sent after ASKING gave.
    Asked(Asked),
    /// Whether Redis would run each command ([`Send::MayRun`]).
    MayRun(bool),
    /// The read of [`Send::Follow`] is done.
    Followed,
    /// A wait ended.
    Woke,
}

/// The plan of a `/pipeline` (`atomic` false) or a `/multi-exec` of `n` commands.
///
/// A transaction goes at once. A pipeline goes in chunks sized from what the previous one
/// cost, so that Redis stops receiving it once the request's time is spent: a pipeline of
/// slow reads (each cheap to send, costly to run) cannot hold Redis for hours. The first chunk
/// is one command: nothing is known yet of what they cost. On a Cluster a pipeline's entries
/// go one by one instead (redis-rs resends a whole pipeline after one entry's redirection).
/// The replies together stay within `--max-response-bytes`, as one call's would.
#[derive(Debug)]
pub(crate) struct Batch {
    n: usize,
    atomic: bool,
    cluster: bool,
    timeout: Duration,
    max_response: usize,
    wait: Option<ReplicaWait>,
    started: Instant,
    /// The replies so far, in order.
    items: Vec<Value>,
    chunk: usize,
    /// The dearest cost per command seen so far.
    dearest: Duration,
    /// The replies' size so far, once encoded at most.
    held: usize,
    /// When the chunk in flight was first sent.
    sent_at: Instant,
    /// Whether a discarded Cluster transaction may be sent again (asked at its first
    /// EXECABORT, once per request).
    may_run: Option<bool>,
    /// The EXECABORT of the chunk in flight while its ASK is followed.
    aborted: Option<Failure>,
}

impl Batch {
    /// The plan of `n` commands started at `now`.
    pub(crate) fn new(
        now: Instant,
        n: usize,
        atomic: bool,
        cluster: bool,
        timeout: Duration,
        max_response: usize,
        wait: Option<ReplicaWait>,
    ) -> Self {
        Batch {
            n,
            atomic,
            cluster,
            timeout,
            max_response,
            wait,
            started: now,
            items: Vec::with_capacity(n),
            chunk: if atomic { n } else { 1 },
            dearest: Duration::ZERO,
            held: 0,
            sent_at: now,
            may_run: None,
            aborted: None,
        }
    }

    /// The first step.
    pub(crate) fn start(&mut self, now: Instant) -> Step<Send, Vec<Value>> {
        self.send_next(now)
    }

    /// The step after `outcome`, at `now`.
    pub(crate) fn next(&mut self, now: Instant, outcome: BatchOutcome) -> Step<Send, Vec<Value>> {
        match outcome {
            BatchOutcome::Entry(answer, waited) => self.entry(now, answer, waited),
            BatchOutcome::Chunk(answer) => self.chunk_answered(now, answer),
            BatchOutcome::Located(Ok(Some(node))) => {
                Step::Send(Send::Asking { range: self.range(), node, within: self.left(now) })
            }
            BatchOutcome::Located(found) => {
                let aborted = self.aborted.take().expect("located after an EXECABORT");
                self.after_ask(now, Err(found.err().unwrap_or(aborted)))
            }
            BatchOutcome::Asked(asked) => {
                let aborted = self.aborted.take().expect("asked after an EXECABORT");
                let answer = match asked {
                    Asked::Ran(values) => Ok(Some(Value::Array(values))),
                    Asked::Refused => Err(aborted),
                    Asked::Failed(f) => Err(f),
                };
                self.after_ask(now, answer)
            }
            BatchOutcome::MayRun(may) => {
                self.may_run = Some(may);
                self.discarded(now)
            }
            BatchOutcome::Followed => Step::Wait(now + BUSY_PAUSE),
            BatchOutcome::Woke => self.resend(now),
        }
    }

    /// What is left of the request's time at `now` (at least 1 ms: a step is always given
    /// time to be tried).
    fn left(&self, now: Instant) -> Duration {
        self.timeout.saturating_sub(self.elapsed(now)).max(Duration::from_millis(1))
    }

    fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// The commands of the chunk in flight (or next).
    fn range(&self) -> Range<usize> {
        let from = self.items.len();
        from..(from + self.chunk).min(self.n)
    }

    /// Sends the next chunk or entry, or answers when all are answered or time is spent.
    fn send_next(&mut self, now: Instant) -> Step<Send, Vec<Value>> {
        let from = self.items.len();
        if from >= self.n {
            return Step::Answer(Ok(std::mem::take(&mut self.items)));
        }
        if from > 0 && self.elapsed(now) >= self.timeout {
            return Step::Answer(Err(self.past_timeout(format!(
                "Redis answered its first {from} of {} commands (an error reply among them ran nothing), the rest were not sent",
                self.n
            ))));
        }
        self.sent_at = now;
        self.resend(now)
    }

    /// Sends the chunk or entry in flight (again).
    fn resend(&mut self, now: Instant) -> Step<Send, Vec<Value>> {
        let within = self.left(now);
        if self.cluster && !self.atomic {
            return Step::Send(Send::Entry { at: self.items.len(), within });
        }
        Step::Send(Send::Chunk { range: self.range(), within })
    }

    /// "The pipeline ran past --timeout-ms", then what `happened`.
    fn past_timeout(&self, happened: String) -> Failure {
        error(
            StatusCode::GATEWAY_TIMEOUT,
            format!("ERR the pipeline ran past --timeout-ms ({} ms): {happened}", self.timeout.as_millis()),
        )
    }

    /// Adds `size` bytes of replies; a failure past `--max-response-bytes`.
    fn hold(&mut self, size: usize) -> Result<(), Failure> {
        self.held += size;
        if self.held > self.max_response {
            return Err(too_large(self.max_response, ": ask for less at once (fewer commands per pipeline)"));
        }
        Ok(())
    }

    /// An entry of a pipeline on a Cluster answered.
    fn entry(&mut self, now: Instant, answer: Result<Value, Failure>, waited: Option<Value>) -> Step<Send, Vec<Value>> {
        let from = self.items.len();
        let value = match (answer, &self.wait, waited) {
            (Err(f), ..) if f.cause == Cause::TimedOut => {
                return Step::Answer(Err(self.past_timeout(format!(
                    "Redis answered its first {from} of {} commands (an error reply among them ran nothing), the next may or may not have, the rest were not sent",
                    self.n
                ))));
            }
            (Err(f), ..) => return Step::Answer(Err(f)),
            // A money call's error reply wrote nothing: there is nothing to wait for.
            (Ok(v @ Value::ServerError(_)), ..) => v,
            (Ok(v), Some(wait), Some(waited)) => match durable(wait, v, &waited) {
                Ok(v) => v,
                Err(f) => return Step::Answer(Err(f)),
            },
            (Ok(v), ..) => v,
        };
        // The Cluster could not serve this entry (CLUSTERDOWN, TRYAGAIN) and it was waited out
        // to the limit: nothing is left for the rest. Said as such (503), not as a timeout that
        // "ran" the entries before.
        if let Value::ServerError(e) = &value
            && failure::kind_of(e) == ErrorKind::Unavailable
        {
            failure::count_redis_error("unavailable");
            return Step::Answer(Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{} (waited out to --timeout-ms): Redis answered the pipeline's first {from} of {} commands (an error reply among them ran nothing), did not run the next, and the rest were not sent",
                    reply::server_error_text(e),
                    self.n
                ),
            )));
        }
        if let Err(f) = self.hold(reply::encoded_len_bound(&value, reply::Encoding::Resp2)) {
            return Step::Answer(Err(f));
        }
        self.items.push(value);
        self.send_next(now)
    }

    /// A chunk answered (before its ASK is followed, if it needs to be).
    fn chunk_answered(&mut self, now: Instant, answer: Result<Option<Value>, Failure>) -> Step<Send, Vec<Value>> {
        match answer {
            // A Cluster transaction discarded whole: its keys may have left for the node a
            // migration moves them to, where it is sent once after ASKING.
            Err(f) if f.cause == Cause::ExecAbort && self.atomic && self.cluster => {
                self.aborted = Some(f);
                Step::Send(Send::Locate { range: self.range(), within: self.left(now) })
            }
            answer => self.after_ask(now, answer),
        }
    }

    /// A chunk answered, its ASK followed if it had one.
    fn after_ask(&mut self, now: Instant, answer: Result<Option<Value>, Failure>) -> Step<Send, Vec<Value>> {
        let part = self.range().len();
        let answer = match answer {
            Err(f) if f.cause == Cause::TimedOut && !self.atomic => Err(self.past_timeout(format!(
                "Redis answered its first {} of {} commands (an error reply among them ran nothing), the {part} sent after them may or may not have, the rest were not sent",
                self.items.len(),
                self.n,
            ))),
            other => other,
        };
        // Every entry refused BUSY (a script past its bound, about to be killed) or LOADING (a
        // restart): none ran, so the whole chunk may run again.
        let all_busy = match &answer {
            Err(f) => f.cause == Cause::Reply(ErrorKind::Unavailable),
            Ok(Some(Value::Array(items))) => items
                .iter()
                .all(|v| matches!(v, Value::ServerError(e) if failure::kind_of(e) == ErrorKind::Unavailable)),
            _ => false,
        };
        if all_busy && self.elapsed(now) < self.timeout {
            return Step::Wait(now + BUSY_PAUSE);
        }
        match answer {
            Err(f) if f.cause == Cause::ExecAbort && self.atomic && self.cluster => {
                self.aborted = Some(f);
                self.discarded(now)
            }
            Err(f) => Step::Answer(Err(f)),
            Ok(Some(Value::Array(got))) if got.len() == part => self.chunk_ran(now, got),
            // On a Cluster the chunk spans slots and was not sent: send less at once.
            Ok(None) if part > 1 && !self.atomic => {
                self.chunk = part / 2;
                self.send_next(now)
            }
            Ok(None) => Step::Answer(Err(error(
                StatusCode::BAD_REQUEST,
                "CROSSSLOT a transaction's keys must hash to one slot on a Redis Cluster (use a {hash tag}); nothing ran",
            ))),
            Ok(_) => Step::Answer(Err(error(StatusCode::BAD_GATEWAY, "ERR unexpected pipeline reply from Redis"))),
        }
    }

    /// A Cluster transaction discarded whole (its EXECABORT in `self.aborted`) although, once
    /// asked, Redis knows each command and the token's user may run each: its slot is moving
    /// between masters or cannot be served now (the queued commands answered MOVED, ASK,
    /// TRYAGAIN, CLUSTERDOWN, OOM). Nothing ran, so it is sent again within the time limit,
    /// then 503.
    fn discarded(&mut self, now: Instant) -> Step<Send, Vec<Value>> {
        match self.may_run {
            None => {
                Step::Send(Send::MayRun { range: self.range(), within: self.timeout.saturating_sub(self.elapsed(now)) })
            }
            Some(false) => Step::Answer(Err(self.aborted.take().expect("discarded after an EXECABORT"))),
            Some(true) if self.elapsed(now) + RESEND_MARGIN < self.timeout => {
                self.aborted = None;
                Step::Send(Send::Follow { at: self.items.len() })
            }
            Some(true) => Step::Answer(Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ERR Redis discarded the transaction (EXECABORT) although each command is valid: its slot is moving between Cluster nodes or cannot be served now (MOVED, ASK, TRYAGAIN, CLUSTERDOWN or OOM); nothing ran, retry",
            ))),
        }
    }

    /// A chunk's replies `got`: kept, and the next chunk sized.
    fn chunk_ran(&mut self, now: Instant, got: Vec<Value>) -> Step<Send, Vec<Value>> {
        let part = got.len();
        let size = got.iter().map(|v| reply::encoded_len_bound(v, reply::Encoding::Resp2)).sum();
        if let Err(f) = self.hold(size) {
            return Step::Answer(Err(f));
        }
        self.items.extend(got);
        // The next chunk fits what is left at the dearest rate seen so far, and at most doubles
        // (up to 32): cheap commands first cannot buy a large chunk of dear ones after them.
        let per_command = now.saturating_duration_since(self.sent_at) / u32::try_from(part).unwrap_or(u32::MAX).max(1);
        self.dearest = self.dearest.max(per_command);
        let left = self.timeout.saturating_sub(self.elapsed(now));
        let fits = usize::try_from(left.as_nanos() / self.dearest.as_nanos().max(1)).unwrap_or(usize::MAX);
        self.chunk = fits.min(part.saturating_mul(2)).clamp(1, MAX_CHUNK);
        self.send_next(now)
    }
}

#[cfg(test)]
mod tests;
