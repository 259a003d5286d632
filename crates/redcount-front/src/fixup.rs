//! What the front does to a script command before and after Redis sees it: Upstash's
//! `allow-key-locking` scripts rewritten (and remembered by the SHA the client knows), and a
//! read-only token's EVAL_RO turned into EVALSHA_RO of a script the full token loaded.

use axum::http::StatusCode;
use redis::Value;

use crate::auth::Access;
use crate::failure::{Failure, error};
use crate::request::Cmd;
use crate::scripts::{self, Rewritten, Scripts};

/// After-effects of script handling on one command.
pub(crate) enum Fixup {
    None,
    /// A rewritten script: remember it once Redis accepted it; after SCRIPT LOAD, reply with
    /// the client's SHA instead of Redis's.
    Learn {
        client_sha: String,
        rw: Rewritten,
        reply_sha: bool,
    },
    /// On NOSCRIPT, send this source again (Redis lost a rewritten script), with EVAL_RO when
    /// the client sent EVALSHA_RO: a fallback never widens what the client asked for.
    Reload {
        rw: Rewritten,
        readonly: bool,
    },
    /// SCRIPT FLUSH succeeded: forget the rewrites.
    Flushed,
    /// A read-only token's EVAL_RO, sent as EVALSHA_RO of this SHA: it may run only a script
    /// a full-token client has loaded, so it can neither fill Redis's script cache nor run
    /// Lua no one vetted (a pattern match or `string.rep` inside one C call cannot be killed).
    Vetted(String),
}

impl Fixup {
    /// Prepares `cmd` for Redis and says what to do with its reply.
    pub(crate) fn prepare(scripts: &Scripts, access: &Access, cmd: &mut Cmd) -> Fixup {
        let upper = crate::commands::Cased::upper(&cmd.name);
        let upper = upper.as_str();
        match upper {
            "EVAL_RO" if access.readonly() && !cmd.args.is_empty() => {
                let _ = scripts.prepare_source(&mut cmd.args[0]);
                let sha = scripts::sha_hex(&cmd.args[0]);
                cmd.name = "EVALSHA_RO".into();
                cmd.args[0] = sha.clone().into_bytes();
                Fixup::Vetted(sha)
            }
            "EVAL" | "EVAL_RO" => match cmd.args.get_mut(0).and_then(|src| scripts.prepare_source(src)) {
                Some((client_sha, rw)) => Fixup::Learn { client_sha, rw, reply_sha: false },
                None => Fixup::None,
            },
            "EVALSHA" | "EVALSHA_RO" => match cmd.args.first().and_then(|sha| scripts.lookup(sha)) {
                Some(rw) => {
                    cmd.args[0] = rw.sha.clone().into_bytes();
                    // The read-only token never makes Redis load a script, not even one it lost.
                    if access.readonly() { Fixup::None } else { Fixup::Reload { rw, readonly: upper == "EVALSHA_RO" } }
                }
                None => Fixup::None,
            },
            "SCRIPT" => Self::prepare_script(scripts, cmd),
            _ => Fixup::None,
        }
    }

    /// [`Fixup::prepare`] for `SCRIPT …`.
    fn prepare_script(scripts: &Scripts, cmd: &mut Cmd) -> Fixup {
        let sub = cmd.args.first().map(|s| s.to_ascii_uppercase());
        match sub.as_deref() {
            Some(b"LOAD") => match cmd.args.get_mut(1).and_then(|src| scripts.prepare_source(src)) {
                Some((client_sha, rw)) => Fixup::Learn { client_sha, rw, reply_sha: true },
                None => Fixup::None,
            },
            Some(b"EXISTS") => {
                for sha in cmd.args.iter_mut().skip(1) {
                    if let Some(rw) = scripts.lookup(sha) {
                        *sha = rw.sha.into_bytes();
                    }
                }
                Fixup::None
            }
            Some(b"FLUSH") => Fixup::Flushed,
            _ => Fixup::None,
        }
    }

    /// Applies the after-effects to Redis's reply for the command.
    pub(crate) fn apply(self, scripts: &Scripts, value: &mut Value) {
        let accepted = !matches!(value, Value::ServerError(_));
        match self {
            Fixup::Learn { client_sha, rw, reply_sha } if accepted => {
                if reply_sha {
                    *value = Value::BulkString(client_sha.clone().into_bytes());
                }
                scripts.learn(client_sha, rw);
            }
            Fixup::Flushed if accepted => scripts.clear(),
            _ => {}
        }
    }

    /// The EVAL (EVAL_RO) that sends a lost rewritten script's source again, in place of
    /// `cmd`, its EVALSHA; `None` when Redis may not be asked to load it.
    pub(crate) fn reload(&self, cmd: &Cmd) -> Option<Cmd> {
        let Fixup::Reload { rw, readonly } = self else { return None };
        let name = if *readonly { "EVAL_RO" } else { "EVAL" };
        let mut eval = Cmd { name: name.into(), args: cmd.args.clone() };
        eval.args[0] = rw.source.clone();
        Some(eval)
    }

    /// The SHA a read-only token's EVAL_RO runs, if this is one.
    pub(crate) fn vetted(&self) -> Option<&str> {
        match self {
            Fixup::Vetted(sha) => Some(sha),
            _ => None,
        }
    }
}

/// The refusal of a read-only token's script no full-token client loaded.
pub(crate) fn unloaded(fixup: &Fixup) -> Failure {
    let sha = fixup.vetted().unwrap_or("");
    error(
        StatusCode::FORBIDDEN,
        format!(
            "NOPERM this token is read-only and may run only scripts a full-token client has loaded: load script {sha} with SCRIPT LOAD (or run it once) with the full token"
        ),
    )
}
