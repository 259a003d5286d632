//! Which commands a token may send: what cannot run over REST, administration unless allowed,
//! what reaches beyond one app's keys for a `--tokens` token, and anything but reads under a
//! read-only token. Pure: decided from the command and Redis's `COMMAND` table.

use axum::http::StatusCode;

use crate::auth::Access;
use crate::commands::{self, Table};
use crate::failure::{Failure, error};
use crate::request::Cmd;

/// What the rules are decided with.
pub(crate) struct Rules<'a> {
    /// Redis's `COMMAND` table.
    pub commands: &'a Table,
    /// `--allow-admin-commands`.
    pub allow_admin: bool,
    /// Whether the read-only token's Redis user could be set up (otherwise it may not run
    /// scripts at all).
    pub readonly_scripts: bool,
    /// `--max-response-bytes`.
    pub max_response: usize,
}

impl Rules<'_> {
    /// Refuses what cannot run over REST, administration unless allowed, and anything but
    /// reads under the read-only token.
    pub(crate) fn check(&self, cmd: &Cmd, access: &Access) -> Result<(), Failure> {
        if let Some(why) = commands::refusal(&cmd.name, &cmd.args) {
            return Err(error(StatusCode::BAD_REQUEST, why));
        }
        if let Some(why) = commands::oversized(&cmd.name, &cmd.args, self.max_response) {
            return Err(error(StatusCode::BAD_REQUEST, why));
        }
        if let Some(why) = commands::repeated_keys(&cmd.name, &cmd.args) {
            return Err(error(StatusCode::BAD_REQUEST, why));
        }
        // One look-up in the command table for every rule below.
        let flags = self.commands.flags(&cmd.name, &cmd.args);
        if !self.allow_admin && flags.admin {
            return Err(error(
                StatusCode::FORBIDDEN,
                format!(
                    "NOPERM {} is an administrative command; redcount-rest refuses those unless started with --allow-admin-commands",
                    display_name(cmd)
                ),
            ));
        }
        // After the administrative check: CLIENT KILL, PAUSE… keep saying what allows them.
        if flags.changes_connection {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("ERR {} would change the shared connection and is not available over REST", display_name(cmd)),
            ));
        }
        // A token of one app among several: what reaches beyond the keys its ACL user names is
        // refused whatever that user may do (Redis refuses it inside scripts: the front denies it
        // to the user, see `Table::one_app_rules`).
        if matches!(access, Access::Scoped { .. }) && flags.beyond_one_app {
            return Err(error(
                StatusCode::FORBIDDEN,
                format!(
                    "NOPERM {} reaches beyond one app's keys (every key or channel, another database or server, every app's scripts or functions, or the server itself); a --tokens token may not run it",
                    display_name(cmd)
                ),
            ));
        }
        if !access.readonly() {
            return Ok(());
        }
        self.check_readonly(cmd, flags.readonly)
    }

    /// The rules of a read-only token (`readonly`: the command's flags say it only reads).
    fn check_readonly(&self, cmd: &Cmd, readonly: bool) -> Result<(), Failure> {
        if let Some(why) = commands::readonly_refusal(&cmd.name) {
            return Err(error(StatusCode::FORBIDDEN, why));
        }
        let upper = cmd.name.to_ascii_uppercase();
        if !self.readonly_scripts && matches!(upper.as_str(), "EVAL_RO" | "EVALSHA_RO" | "FCALL_RO") {
            return Err(error(
                StatusCode::FORBIDDEN,
                format!(
                    "NOPERM this token is read-only and may not run {upper}: the front could not set up the Redis ACL user that makes scripts read-only (see its log)"
                ),
            ));
        }
        // PING and ECHO touch no data (Redis does not flag them read-only; clients probe with PING).
        let harmless = matches!(upper.as_str(), "PING" | "ECHO");
        if !harmless && !readonly {
            let hint = match upper.as_str() {
                "EVAL" => " (use EVAL_RO)",
                "EVALSHA" => " (use EVALSHA_RO)",
                _ => "",
            };
            return Err(error(
                StatusCode::FORBIDDEN,
                format!("NOPERM this token is read-only and {} is not a read-only command{hint}", display_name(cmd)),
            ));
        }
        Ok(())
    }
}

/// `CONFIG SET` rather than `CONFIG`, for messages.
fn display_name(cmd: &Cmd) -> String {
    let upper = cmd.name.to_ascii_uppercase();
    match (upper.as_str(), cmd.args.first()) {
        (
            "SCRIPT" | "CONFIG" | "CLIENT" | "OBJECT" | "MEMORY" | "XINFO" | "FUNCTION" | "ACL" | "CLUSTER" | "SLOWLOG"
            | "LATENCY" | "MODULE" | "COMMAND" | "PUBSUB" | "XGROUP",
            Some(sub),
        ) => format!("{upper} {}", String::from_utf8_lossy(sub).to_ascii_uppercase()),
        _ => upper,
    }
}
