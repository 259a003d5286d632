//! The thin driver: does what a plan ([`crate::plan`]) decides, against Redis, and hands it
//! each outcome with the time. Besides the plan's steps it does only what needs Redis to be
//! known: whether a read-only token's script was loaded (`SCRIPT EXISTS`), and why a
//! connection ended (`explain_lost`).

use std::future::Future;
use std::time::{Duration, Instant};

use axum::response::Response;
use redis::Value;

use crate::State;
use crate::auth::Access;
use crate::backend::{Backend, Failed, Held, Lane};
use crate::failure::{Cause, Failure, error, failure, server_error, timed_out};
use crate::fixup::{Fixup, unloaded};
use crate::plan::{Asked, Batch, BatchOutcome, One, Outcome, Send, Step, Which};
use crate::request::{Cmd, Format};
use crate::respond;

/// Runs one command, checked already: its script fix-ups, then its plan, then its answer.
pub(crate) async fn run_one(st: &State, access: &Access, mut cmd: Cmd, format: Format) -> Result<Response, Failure> {
    let fixup = Fixup::prepare(&st.scripts, access, &mut cmd);
    if !unvetted(st, std::slice::from_ref(&fixup)).await?.is_empty() {
        return Err(unloaded(&fixup));
    }
    let redis_cmd = cmd.to_redis();
    // The client's own SCRIPT KILL / FUNCTION KILL must not queue behind the script.
    let kill = (cmd.name.eq_ignore_ascii_case("SCRIPT") || cmd.name.eq_ignore_ascii_case("FUNCTION"))
        && cmd.args.first().is_some_and(|a| a.eq_ignore_ascii_case(b"KILL"));
    let be = if kill { &st.killer } else { backend(st, access) };
    let lane = lane(&[&cmd]);
    let waits = be.waits_for(&redis_cmd);
    let wait = if waits { be.replica_wait() } else { None };
    let mut plan = One::new(Instant::now(), st.timeout, be.is_cluster(), fixup.reload(&cmd).is_some(), wait);
    let mut permits = Held::default();
    let mut step = plan.start();
    let mut value = loop {
        let outcome = match step {
            Step::Answer(answer) => break answer?,
            Step::Wait(until) => {
                tokio::time::sleep_until(until.into()).await;
                Outcome::Woke
            }
            Step::Send(Which::Command) if waits => match timed(st, be.query_waited(&redis_cmd, &mut permits)).await {
                Ok((reply, waited)) => Outcome::Answered(Ok(reply), Some(waited)),
                Err(f) => Outcome::Answered(Err(f), None),
            },
            Step::Send(Which::Command) => {
                Outcome::Answered(timed(st, be.query_in(&redis_cmd, lane, &mut permits)).await, None)
            }
            Step::Send(Which::Reload) => {
                // Redis lost a script it knew under the rewritten SHA: send the source again.
                metrics::counter!("redcount_rest_noscript_reloads_total").increment(1);
                let eval = fixup.reload(&cmd).expect("a reload is planned only for a rewritten script");
                st.rules().check(&eval, access)?;
                let eval = eval.to_redis();
                let sent = be.query_in(&eval, Lane::Bounded, &mut permits);
                Outcome::Answered(Box::pin(timed(st, sent)).await, None)
            }
        };
        step = plan.next(Instant::now(), outcome);
    };
    fixup.apply(&st.scripts, &mut value);
    if let Value::ServerError(e) = &value {
        return Err(server_error(e));
    }
    respond::one(&st.bounds(), &value, format, permits)
}

/// Runs a `/pipeline` (`atomic` false) or `/multi-exec` whose entries were checked: the
/// refused ones answer for themselves, the others are sent as the plan says, in order.
pub(crate) async fn run_many(
    st: &State,
    access: &Access,
    entries: Vec<Result<Cmd, Failure>>,
    atomic: bool,
    format: Format,
) -> Result<Response, Failure> {
    let (cmds, fixups, refused) = prepare_many(st, access, entries, atomic).await?;
    let be = backend(st, access);
    let lane = if atomic { Lane::Bounded } else { lane(&cmds.iter().collect::<Vec<_>>()) };
    let mut permits = Held::default();
    let plan =
        Batch::new(Instant::now(), cmds.len(), atomic, be.is_cluster(), st.timeout, st.max_response, be.replica_wait());
    let batch = BatchCtx { st, access, be, lane, cmds: &cmds, atomic };
    let mut items = batch.drive(plan, &mut permits).await?;
    // A pipeline does not reload a lost script (its NOSCRIPT reaches the client, whose
    // own fallback sends the source).
    for (item, fix) in items.iter_mut().zip(fixups) {
        fix.apply(&st.scripts, item);
    }
    // Back in request order, the refused entries in their places.
    let mut sent = items.iter();
    let mut refused = refused.into_iter().peekable();
    let mut answers: Vec<Result<&Value, Failure>> = Vec::with_capacity(items.len() + refused.len());
    while let Some(answer) = match refused.peek() {
        Some((i, _)) if *i == answers.len() => refused.next().map(|(_, f)| Err(f)),
        _ => sent.next().map(Ok),
    } {
        answers.push(answer);
    }
    respond::many(&st.bounds(), &answers, atomic, format, permits)
}

/// A batch's commands to send, their fix-ups, and the refused entries with their positions.
/// A read-only token's script no full-token client loaded is refused in its entry in a
/// pipeline, and refuses a transaction whole.
async fn prepare_many(
    st: &State,
    access: &Access,
    entries: Vec<Result<Cmd, Failure>>,
    atomic: bool,
) -> Result<(Vec<Cmd>, Vec<Fixup>, Vec<(usize, Failure)>), Failure> {
    let mut refused: Vec<(usize, Failure)> = Vec::new();
    let mut cmds = Vec::with_capacity(entries.len());
    let mut at = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        match e {
            Ok(c) => {
                cmds.push(c);
                at.push(i);
            }
            Err(f) => refused.push((i, f)),
        }
    }
    let mut fixups: Vec<Fixup> = cmds.iter_mut().map(|c| Fixup::prepare(&st.scripts, access, c)).collect();
    let unvetted = unvetted(st, &fixups).await?;
    if let Some(&first) = unvetted.first()
        && atomic
    {
        return Err(unloaded(&fixups[first]));
    }
    for &i in unvetted.iter().rev() {
        refused.push((at[i], unloaded(&fixups[i])));
        cmds.remove(i);
        fixups.remove(i);
    }
    refused.sort_by_key(|(i, _)| *i);
    Ok((cmds, fixups, refused))
}

/// What a batch's steps are done with.
struct BatchCtx<'a> {
    st: &'a State,
    access: &'a Access,
    be: &'a Backend,
    lane: Lane,
    cmds: &'a [Cmd],
    atomic: bool,
}

impl BatchCtx<'_> {
    /// Does the steps of a batch's `plan` until its answer.
    async fn drive(&self, mut plan: Batch, permits: &mut Held) -> Result<Vec<Value>, Failure> {
        let mut step = plan.start(Instant::now());
        loop {
            let outcome = match step {
                Step::Answer(answer) => return answer,
                Step::Wait(until) => {
                    tokio::time::sleep_until(until.into()).await;
                    BatchOutcome::Woke
                }
                Step::Send(send) => Box::pin(self.send(send, permits)).await,
            };
            step = plan.next(Instant::now(), outcome);
        }
    }

    /// Does one [`Send`] of a batch's plan.
    async fn send(&self, send: Send, permits: &mut Held) -> BatchOutcome {
        let (st, be, cmds) = (self.st, self.be, self.cmds);
        match send {
            Send::Chunk { range, within } => {
                let pipe = pipeline(&cmds[range], self.atomic);
                BatchOutcome::Chunk(timed_within(st, within, be.pipeline(&pipe, self.lane, permits)).await)
            }
            Send::Entry { at, within } => entry(st, be, self.lane, &cmds[at], within, permits).await,
            Send::Locate { range, within } => {
                let found = tokio::time::timeout(within, be.locate(&cmds[range.start].to_redis())).await;
                BatchOutcome::Located(found.map_err(|_| timed_out(st.timeout)))
            }
            Send::Asking { range, node, within } => {
                let pipe = pipeline(&cmds[range], true);
                BatchOutcome::Asked(match timed_within(st, within, be.transaction_at(&pipe, &node)).await {
                    Ok(Some(values)) => Asked::Ran(values),
                    Ok(None) => Asked::Refused,
                    Err(f) => Asked::Failed(f),
                })
            }
            Send::MayRun { range, within } => {
                let part = &cmds[range];
                let valid = part.iter().all(|c| st.commands.is_well_formed(&c.name, &c.args));
                BatchOutcome::MayRun(valid && may_run_all(st, self.access, part, within).await)
            }
            Send::Follow { at } => {
                be.follow_slot_of(&cmds[at].to_redis()).await;
                BatchOutcome::Followed
            }
        }
    }
}

/// `cmds` as one pipeline whose error replies come back in place; a transaction when the
/// batch is one (`atomic`: every chunk of a pipeline is not).
fn pipeline(cmds: &[Cmd], atomic: bool) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    if atomic {
        pipe.atomic();
    }
    for c in cmds {
        pipe.add_command(c.to_redis());
    }
    pipe
}

/// One entry of a pipeline on a Cluster: its reply, an error reply as that entry's answer.
async fn entry(st: &State, be: &Backend, lane: Lane, cmd: &Cmd, within: Duration, permits: &mut Held) -> BatchOutcome {
    let cmd = cmd.to_redis();
    let in_place = |e: Failed| match e {
        Failed::Redis(e) => redis::ServerError::try_from(e).map(Value::ServerError).map_err(Failed::Redis),
        other => Err(other),
    };
    if be.waits_for(&cmd) {
        let sent = async {
            be.query_waited(&cmd, permits).await.map(|(v, w)| (v, Some(w))).or_else(|e| in_place(e).map(|v| (v, None)))
        };
        return match timed_within(st, within, sent).await {
            Ok((v, waited)) => BatchOutcome::Entry(Ok(v), waited),
            Err(f) => BatchOutcome::Entry(Err(f), None),
        };
    }
    let sent = async { be.query_in(&cmd, lane, permits).await.or_else(in_place) };
    BatchOutcome::Entry(timed_within(st, within, sent).await, None)
}

/// A connection Redis closed in the middle of a request while Redis itself stayed up (same
/// run id) was dropped on purpose, and with the front's output-buffer limit in force the
/// reason is most likely that the reply passed it: say so, as the client's error. Not for
/// `small` requests (redcount's own scripts, whose replies are a few integers): those lost
/// their connection some other way (a kill, the network) and stay a 503.
pub(crate) async fn explain_lost(st: &State, f: Failure, small: bool) -> Failure {
    if small || f.cause != Cause::Lost || st.output_limit == 0 {
        return f;
    }
    let Some(known) = st.run_id.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return f };
    let now = run_id(&st.killer).await;
    if now.as_ref() != Some(&known) {
        // Redis restarted: this connection may have ended with it, so this answer stays a
        // 503; later ones are judged against the new Redis once the limit is seen there.
        if let Some(now) = now
            && limit_in_force(st).await
        {
            *st.run_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        }
        return f;
    }
    error(
        axum::http::StatusCode::BAD_REQUEST,
        format!(
            "ERR Redis closed the connection instead of answering: the reply passed its output-buffer limit for normal clients ({} bytes, --redis-output-limit-bytes); ask for less at once (a write in the same request may or may not have happened)",
            st.output_limit
        ),
    )
}

/// The run id of the Redis `backend` reaches (INFO server), if it answers within 500 ms.
pub(crate) async fn run_id(backend: &Backend) -> Option<String> {
    let info = tokio::time::timeout(Duration::from_millis(500), backend.query(redis::cmd("INFO").arg("server")))
        .await
        .ok()?
        .ok()?;
    let text = match info {
        Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        Value::VerbatimString { text, .. } => text,
        _ => return None,
    };
    text.lines().find_map(|l| l.strip_prefix("run_id:")).map(|id| id.trim().to_string())
}

/// True when Redis's output-buffer limit for normal clients is the one the front sets.
async fn limit_in_force(st: &State) -> bool {
    let get = redis::cmd("CONFIG").arg("GET").arg("client-output-buffer-limit").clone();
    let reply = tokio::time::timeout(Duration::from_millis(500), st.killer.query(&get)).await;
    let Ok(Ok(Value::Array(items))) = reply else { return false };
    let want = format!("normal {} 0 0", st.output_limit);
    items.iter().any(|v| matches!(v, Value::BulkString(b) if String::from_utf8_lossy(b).contains(&want)))
}

/// The positions in `fixups` of a read-only token's EVAL_RO of a script Redis does not have
/// (so no full-token client loaded it): those are refused before anything of the request runs.
async fn unvetted(st: &State, fixups: &[Fixup]) -> Result<Vec<usize>, Failure> {
    let shas: Vec<(usize, &str)> = fixups.iter().enumerate().filter_map(|(i, f)| Some((i, f.vetted()?))).collect();
    if shas.is_empty() {
        return Ok(Vec::new());
    }
    let mut exists = redis::cmd("SCRIPT");
    exists.arg("EXISTS");
    for (_, sha) in &shas {
        exists.arg(*sha);
    }
    let found: Vec<bool> = match Box::pin(timed(st, backend(st, &Access::ReadOnly).query(&exists))).await? {
        Value::Array(items) => items.iter().map(|v| matches!(v, Value::Int(1))).collect(),
        Value::Int(n) => vec![n == 1],
        _ => vec![false],
    };
    Ok(shas
        .iter()
        .zip(found.iter().chain(std::iter::repeat(&false)))
        .filter(|(_, ok)| !**ok)
        .map(|((i, _), _)| *i)
        .collect())
}

/// Whether the token's Redis user may run each of `cmds`: the full and read-only tokens' users
/// are the front's own (what they may not run is refused before sending); a `--tokens` user
/// is asked about with `ACL DRYRUN` (Redis 7), so that a transaction its ACL refused is not
/// taken for one whose slot was moving. Not known (no DRYRUN, no permission, no answer
/// `within`): false.
async fn may_run_all(st: &State, access: &Access, cmds: &[Cmd], within: Duration) -> bool {
    let Access::Scoped { .. } = access else { return true };
    let Some(login) = access.login() else { return false };
    let deadline = Instant::now() + within;
    for c in cmds {
        let mut dryrun = redis::cmd("ACL");
        dryrun.arg("DRYRUN").arg(&login.user).arg(&c.name);
        for a in &c.args {
            dryrun.arg(a.as_slice());
        }
        match timed_within(st, deadline.saturating_duration_since(Instant::now()), st.killer.query(&dryrun)).await {
            Ok(Value::Okay) => {}
            Ok(Value::SimpleString(s)) if s == "OK" => {}
            _ => return false,
        }
    }
    true
}

/// `f` under the request's timeout. Not an `async fn`: each layer of those would hold `f` by
/// value and move it once more when started (a request's Redis call is kilobytes).
fn timed<T, F: Future<Output = Result<T, Failed>>>(
    st: &State,
    f: F,
) -> impl Future<Output = Result<T, Failure>> + use<T, F> {
    timed_within(st, st.timeout, f)
}

/// [`timed`] with `limit` instead of the whole request timeout (what is left of it).
fn timed_within<T, F: Future<Output = Result<T, Failed>>>(
    st: &State,
    limit: Duration,
    f: F,
) -> impl Future<Output = Result<T, Failure>> + use<T, F> {
    let timeout = st.timeout;
    futures_util::FutureExt::map(tokio::time::timeout(limit, f), move |r| match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failure(&e, timeout)),
        Err(_) => Err(timed_out(timeout)),
    })
}

/// The shared connections for requests whose replies are small by construction (redcount's
/// own scripts, commands that answer an integer), a bounded connection of its own for
/// anything else.
fn lane(cmds: &[&Cmd]) -> Lane {
    if !cmds.is_empty() && cmds.iter().all(|c| small_reply(c)) { Lane::Small } else { Lane::Bounded }
}

/// True when `c`'s reply is a few integers whatever its arguments: one of redcount's own
/// scripts, or a command of [`crate::INTEGER_REPLY_COMMANDS`].
pub(crate) fn small_reply(c: &Cmd) -> bool {
    runs_our_script(c) || crate::INTEGER_REPLY_COMMANDS.iter().any(|n| c.name.eq_ignore_ascii_case(n))
}

/// True when `c` runs one of redcount's own scripts (EVALSHA of its SHA-1): those reply a few
/// integers by design.
fn runs_our_script(c: &Cmd) -> bool {
    type Shas = std::collections::HashSet<&'static [u8], foldhash::fast::RandomState>;
    static OURS: std::sync::LazyLock<Shas> =
        std::sync::LazyLock::new(|| redcount_core::script::ALL.iter().map(|s| s.sha1().as_bytes()).collect());
    (c.name.eq_ignore_ascii_case("EVALSHA") || c.name.eq_ignore_ascii_case("EVALSHA_RO"))
        && c.args.first().is_some_and(|sha| OURS.contains(sha.as_slice()))
}

/// The connections a request runs on.
fn backend<'a>(st: &'a State, access: &'a Access) -> &'a Backend {
    match (access, &st.readonly_backend) {
        (Access::Scoped { backend, .. }, _) => backend,
        (Access::ReadOnly, Some(ro)) => ro,
        _ => &st.backend,
    }
}
