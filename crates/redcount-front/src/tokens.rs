//! `--tokens FILE`: several apps on one front, each token logged in to Redis as a user of its
//! own, derived from the app's ACL user, so Redis itself enforces what the token may touch (key
//! and channel patterns, commands).
//!
//! The file is a JSON array:
//!
//! ```json
//! [
//!   {"token": "…at least 16 characters…", "user": "app1", "password": "…"},
//!   {"token": "…", "user": "app1-reader", "password": "…", "readonly": true}
//! ]
//! ```
//!
//! The users are the operator's (`ACL SETUSER app1 on >… ~app1:* +@all -@admin`). The front
//! logs each token in as a user derived from them (`cluster_users::Tenant`: the operator's
//! passwords, patterns and commands, and the front's own rules: the commands that reach beyond
//! one app's keys, which key patterns do not stop, `Table::one_app_rules`), and keeps it derived
//! (`cluster_users::Keeper`). It is read at start and again on SIGHUP; a file that cannot be
//! read, a user that cannot log in or that the front cannot derive keeps the tokens in force.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::auth::Scoped;
use crate::backend::{Backend, Login};
use crate::cluster_users::{Keeper, Tenant};

/// Shortest token accepted in the file.
const MIN_TOKEN_LEN: usize = 16;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    token: String,
    user: String,
    password: String,
    #[serde(default)]
    readonly: bool,
}

/// Reads and checks the file. Errors name the entry by position and user, never the token.
fn read(path: &Path, reserved: &[&str], own_user: &str) -> Result<Vec<Entry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let entries: Vec<Entry> =
        serde_json::from_str(&text).map_err(|e| format!("{}: not a JSON array of tokens: {e}", path.display()))?;
    let mut seen = std::collections::HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        let at = format!("{} entry {i} (user {:?})", path.display(), e.user);
        if e.token.trim() != e.token || e.token.len() < MIN_TOKEN_LEN {
            return Err(format!("{at}: the token must be at least {MIN_TOKEN_LEN} characters, no surrounding spaces"));
        }
        if e.user.is_empty() {
            return Err(format!("{at}: no user"));
        }
        // The front derives a user of its own from it, deleted when it finds the user off: its
        // own set-up user must keep its rights, and its own users are not an app's.
        if e.user == own_user || e.user.starts_with("redcount-rest-") {
            return Err(format!(
                "{at}: the user is the front's own (the --redis URL's, or one it makes): give the app a Redis user of its own"
            ));
        }
        if !seen.insert(e.token.as_str()) || reserved.contains(&e.token.as_str()) {
            return Err(format!("{at}: the token is used twice (in the file, or as --token / --readonly-token)"));
        }
    }
    Ok(entries)
}

/// Reads `path` and connects each token's user (`connect` opens a pool logged in as the user,
/// set up as the front's other pools), reusing the connections of `previous` for entries
/// whose token, user and password did not change. Returns the tokens and, beside them, each
/// one's login (kept to tell what changed at the next reload).
pub(crate) async fn load<F, Fut>(
    path: &Path,
    reserved: &[&str],
    previous: &[Scoped],
    logins: &HashMap<String, (String, String)>,
    keeper: &Keeper,
    connect: F,
) -> Result<(Vec<Scoped>, HashMap<String, (String, String)>), String>
where
    F: Fn(Login) -> Fut,
    Fut: std::future::Future<Output = Result<Backend, String>>,
{
    let entries = read(path, reserved, keeper.own_user())?;
    // Every token's user derived first (those kept as well: the operator may have edited
    // theirs before the reload), so that no connection of a token runs before its rules.
    let tenants: Vec<Tenant> =
        entries.iter().map(|e| Tenant::new(&e.token, &e.user, &e.password, e.readonly)).collect();
    let in_force: Vec<Tenant> = previous.iter().map(|s| s.tenant.clone()).collect();
    // The new logins are checked first, changing nothing: a file the reload refuses leaves the
    // users of the tokens in force as they are.
    let new: Vec<usize> = (0..entries.len()).filter(|i| !in_force.contains(&tenants[*i])).collect();
    let fresh: Vec<Tenant> = new.iter().map(|i| tenants[*i].clone()).collect();
    if let Err((j, why)) = keeper.check_logins(&fresh).await {
        let i = new.get(j).copied().unwrap_or(0);
        return Err(format!("{} entry {i}: cannot log in to Redis as {:?}: {why}", path.display(), entries[i].user));
    }
    if let Err(e) = keeper.keep_tenants(&tenants).await {
        keeper.settle(&in_force).await;
        return Err(format!("{}: {e}", path.display()));
    }
    let mut out = Vec::with_capacity(entries.len());
    let mut new_logins = HashMap::new();
    for (i, (e, tenant)) in entries.into_iter().zip(tenants.iter().cloned()).enumerate() {
        let same_login = logins.get(&e.token).is_some_and(|(u, p)| *u == e.user && *p == e.password);
        let kept =
            previous.iter().find(|s| same_login && s.token == e.token).map(|s| (s.backend.clone(), s.revoked.clone()));
        let guarded = keeper.guard(&tenant.derived);
        let (backend, revoked) = match kept {
            Some(k) => k,
            None => {
                let cannot = |why: String| {
                    format!("{} entry {i}: cannot log in to Redis as {:?}: {why}", path.display(), e.user)
                };
                let attempt = match guarded.refusal() {
                    Some(why) => Err(cannot(why)),
                    None => {
                        let login = Login { user: tenant.derived.clone(), password: e.password.clone() };
                        connect(login).await.map_err(cannot)
                    }
                };
                match attempt {
                    Ok(b) => (Arc::new(b), tokio_util::sync::CancellationToken::new()),
                    Err(e) => {
                        keeper.settle(&in_force).await;
                        return Err(e);
                    }
                }
            }
        };
        new_logins.insert(e.token.clone(), (e.user, e.password));
        out.push(Scoped { token: e.token, readonly: e.readonly, backend, revoked, guarded, tenant });
    }
    keeper.settle(&tenants).await;
    Ok((out, new_logins))
}

/// Ends what the tokens of `previous` that `now` no longer has (or has with another login)
/// hold open: their subscriptions. (The users of removed tokens are deleted, which closes
/// their connections: `Keeper::settle`.)
pub(crate) fn revoke_dropped(previous: &[Scoped], now: &[Scoped]) {
    for p in previous {
        if !now.iter().any(|s| s.token == p.token && Arc::ptr_eq(&s.backend, &p.backend)) {
            p.revoked.cancel();
        }
    }
}
