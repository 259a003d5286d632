//! Connecting the front: its Redis users and connections, the settings it keeps on Redis, and
//! its tokens.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::{Config, State, backend, cluster_users, scripts, tokens};

/// Logs a warning when Redis may evict keys: redcount's counting primitives (through the
/// worker or `redcount serve --rest-url`) need `maxmemory-policy noeviction`. The front
/// serves other data too (a cache may want eviction), so it warns rather than refuses.
pub(crate) async fn warn_if_evicting(killer: &backend::Backend) {
    if let (Some(policy), Some(max)) =
        (config_get(killer, "maxmemory-policy").await, config_get(killer, "maxmemory").await)
        && max != "0"
        && policy != "noeviction"
    {
        tracing::warn!(
            "Redis may evict keys (maxmemory-policy {policy}, maxmemory {max}): redcount's counters, quotas, claims and idempotency records need noeviction"
        );
    }
}

/// One setting of Redis's (`CONFIG GET name`), if Redis tells it.
async fn config_get(backend: &backend::Backend, name: &str) -> Option<String> {
    match backend.query(redis::cmd("CONFIG").arg("GET").arg(name)).await {
        Ok(redis::Value::Array(pair)) => pair.get(1).and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()),
        Ok(redis::Value::Map(pairs)) => {
            pairs.first().and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
        }
        _ => None,
    }
}

/// Sets Redis's output-buffer limit for normal clients to `bytes` (0: leaves it). Returns the
/// command that did it, to send again to a restarted Redis.
pub(crate) async fn bound_output_buffers(backend: &backend::Backend, bytes: usize) -> Option<redis::Cmd> {
    if bytes == 0 {
        return None;
    }
    let said = format!("Redis drops a normal client whose pending reply passes {bytes} bytes");
    let risk = "a request for a huge reply makes Redis build it whole before the front refuses it";
    config_set(backend, "client-output-buffer-limit", &format!("normal {bytes} 0 0"), &said, risk).await
}

/// `CONFIG SET name value`, logging `said` when Redis takes it, else the error and `risk`.
/// Returns the command, to send again to a restarted Redis.
async fn config_set(backend: &backend::Backend, name: &str, value: &str, said: &str, risk: &str) -> Option<redis::Cmd> {
    let mut set = redis::cmd("CONFIG");
    set.arg("SET").arg(name).arg(value);
    match backend.query(&set).await {
        Ok(_) => {
            tracing::info!("{said}");
            Some(set)
        }
        Err(e) => {
            tracing::error!("cannot set {name} ({e}): {risk}");
            None
        }
    }
}

/// Makes Redis check the payload of every client's RESTORE deeply (`sanitize-dump-payload
/// clients`, where it is `no`, Redis's default): unchecked, a crafted payload is accepted and
/// the next read of its key crashes Redis. Returns the command that did it, to send again to a
/// restarted Redis; `None` where Redis already checks every payload (`yes`) or refused.
pub(crate) async fn sanitize_restores(backend: &backend::Backend) -> Option<redis::Cmd> {
    if config_get(backend, "sanitize-dump-payload").await.as_deref() == Some("yes") {
        return None;
    }
    let said = "Redis checks every client's RESTORE payload (sanitize-dump-payload clients)";
    let risk = "a RESTORE of a crafted payload by the full token could crash Redis";
    config_set(backend, "sanitize-dump-payload", "clients", said, risk).await
}

/// Redis only answers other clients (and so SCRIPT KILL) while a script runs once
/// `busy-reply-threshold` has passed: bring it down to the front's script bound.
/// Returns the command that did it, to send again to a restarted Redis.
pub(crate) async fn allow_script_kill(backend: &backend::Backend, bound: Duration) -> Option<redis::Cmd> {
    let ms = bound.as_millis().to_string();
    let mut set = redis::cmd("CONFIG");
    set.arg("SET").arg("busy-reply-threshold").arg(&ms);
    if let Err(e) = backend.query(&set).await {
        set = redis::cmd("CONFIG");
        set.arg("SET").arg("lua-time-limit").arg(&ms);
        if backend.query(&set).await.is_err() {
            tracing::error!(
                "cannot set busy-reply-threshold ({e}): a runaway script is killed only after Redis's own threshold"
            );
            return None;
        }
    }
    tracing::info!("scripts are killed after {ms} ms");
    Some(set)
}

/// What a front-made Redis user may not do.
#[derive(Clone, Copy)]
pub(crate) enum Restriction {
    /// The full token: no administration (flag `admin` / category `@admin`), no MIGRATE, no
    /// script debugger, so scripts cannot reach them either.
    Full,
    /// The read-only token: also no writes, pub/sub, blocking, keyspace walks and counts
    /// (`Table::keyspace_walk_rules`), nor PFCOUNT (it rewrites its value's cached cardinality).
    ReadOnly,
}

/// Sets up the Redis ACL user a token's connections log in as, so Redis itself refuses what
/// the token may not run, even inside a script. Named and keyed after the token, so fronts
/// sharing a token share the user and restarts add nothing.
pub(crate) async fn restricted_login(
    setup: &backend::Backend,
    token: &str,
    kind: Restriction,
    extra: &[String],
) -> Result<(backend::Login, redis::Cmd), String> {
    let (tag, rules): (&str, &[&str]) = match kind {
        Restriction::Full => ("full", &["+@all", "-@admin", "-migrate", "-script|debug", "-lcs"]),
        Restriction::ReadOnly => (
            "ro",
            &[
                "+@all",
                "-@write",
                "-@admin",
                "-@dangerous",
                "-@pubsub",
                "-@blocking",
                "-keys",
                "-scan",
                "-pfcount",
                "-lcs",
                "-memory|purge",
                "-script|debug",
            ],
        ),
    };
    let user = format!("redcount-rest-{tag}-{}", &scripts::sha_hex(token.as_bytes())[..12]);
    // The read-only user's password has been derived this way since it was introduced.
    let label = if tag == "ro" { "readonly" } else { tag };
    let password = scripts::sha_hex(format!("redcount-rest {label} user\0{token}").as_bytes());
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(&user).arg("reset").arg("on").arg(format!(">{password}")).arg("~*").arg("&*");
    for rule in rules {
        setuser.arg(*rule);
    }
    setuser.arg(extra);
    setup.query(&setuser).await.map_err(|e| e.to_string())?;
    Ok((backend::Login { user, password }, setuser))
}

/// Loads `--tokens` into `state`, then again on every SIGHUP (a failed reload keeps the
/// tokens in force and says why; it never prints a token): the task that reloads.
pub(crate) async fn scoped_tokens(
    state: &Arc<State>,
    config: &Config,
    path: std::path::PathBuf,
    settings: Vec<redis::Cmd>,
    wait: Option<redcount_cluster::ReplicaWait>,
    keeper: Arc<cluster_users::Keeper>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let (url, cluster, timeout) =
        (config.redis.clone(), config.cluster, Duration::from_millis(config.timeout_ms.max(1)));
    let (max_reply, per_token) = (config.max_response_bytes.max(1024), config.redis_connections.clamp(1, 16));
    let mut reserved = vec![config.token.clone()];
    reserved.extend(config.readonly_token.clone());
    let load = {
        let state = state.clone();
        move |logins: HashMap<String, (String, String)>| {
            let (state, url, path, settings, reserved, keeper) =
                (state.clone(), url.clone(), path.clone(), settings.clone(), reserved.clone(), keeper.clone());
            async move {
                let connect = |login: backend::Login| {
                    // After each new connection logs in the front's rules go on the user again:
                    // a restarted Redis may have made it from its own files without them.
                    let mut on_connect = settings.clone();
                    on_connect.push(keeper.root_rules(&login.user));
                    let (url, state, keeper) = (url.clone(), state.clone(), keeper.clone());
                    async move {
                        let b =
                            backend::Backend::connect(&url, cluster, timeout, Some(&login), per_token, max_reply, wait)
                                .await
                                .map_err(|e| e.to_string())?;
                        b.on_connect(on_connect, Some(&state.killer));
                        b.charge_replies(&state.response_budget);
                        // A restarted Redis that forgot the token's user: derived again, from
                        // the operator's user as it is then.
                        let derived = login.user.clone();
                        Ok(b.restore_by(Arc::new(move || {
                            let (keeper, derived) = (keeper.clone(), derived.clone());
                            Box::pin(async move { keeper.derive_now(&derived).await })
                        })))
                    }
                };
                let previous = state.scoped.read().unwrap_or_else(|e| e.into_inner()).clone();
                let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
                let (scoped, logins) = tokens::load(&path, &reserved, &previous, &logins, &keeper, connect).await?;
                let n = scoped.len();
                tokens::revoke_dropped(&previous, &scoped);
                *state.scoped.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(scoped);
                Ok::<_, String>((n, logins))
            }
        }
    };
    let (n, mut logins) = load(HashMap::new()).await?;
    tracing::info!("{n} tokens from --tokens");
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(|e| e.to_string())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match load(logins.clone()).await {
                Ok((n, new)) => {
                    logins = new;
                    tracing::info!("SIGHUP: {n} tokens from --tokens");
                }
                Err(e) => tracing::error!("SIGHUP: --tokens not reloaded, the tokens in force stay: {e}"),
            }
        }
    }))
}

/// The front's connections to Redis, and what it learnt setting them up.
pub(crate) struct Connected {
    /// The URL's own user: the front's set-up and its SCRIPT KILLs, never a client's request.
    pub killer: backend::Backend,
    /// Redis's `COMMAND` table.
    pub commands: crate::commands::Table,
    /// The full token's connections.
    pub backend: backend::Backend,
    /// The read-only token's, when its Redis user could be set up.
    pub readonly: Option<backend::Backend>,
    /// The users the front made, for the nodes that lack or changed them later.
    pub made_users: Vec<(String, redis::Cmd)>,
    /// The settings the front keeps on Redis (sent again to a restarted one).
    pub settings: Vec<redis::Cmd>,
    /// Redis's output-buffer limit for normal clients as the front set it (0: not set).
    pub output_limit: usize,
    /// The run id of the Redis it set that limit on (not on a Cluster).
    pub run_id: Option<String>,
}

/// Connects to Redis as `config` says: the set-up connection, the tokens' Redis users and
/// their connections, and the settings the front keeps.
pub(crate) async fn connect(config: &Config, wait: Option<redcount_cluster::ReplicaWait>) -> Result<Connected, String> {
    let timeout = config.timeout();
    let unreachable = |e: backend::Failed| format!("cannot reach Redis at {}: {e}", backend::redact(&config.redis));
    let connect = |login: Option<backend::Login>, n: usize, wait: Option<redcount_cluster::ReplicaWait>| {
        let url = config.redis.clone();
        let max_reply = config.max_response_bytes.max(1024);
        async move { backend::Backend::connect(&url, config.cluster, timeout, login.as_ref(), n, max_reply, wait).await }
    };
    let killer = connect(None, 1, None).await.map_err(unreachable)?;
    let commands =
        crate::commands::Table::load(&killer).await.map_err(|e| format!("cannot read COMMAND from Redis: {e}"))?;
    let kill_setting = allow_script_kill(&killer, config.script_timeout()).await;
    let full_login = if config.allow_admin_commands {
        None
    } else {
        restricted_login(&killer, &config.token, Restriction::Full, &[])
            .await
            .inspect_err(|e| {
                tracing::error!(
                    "cannot set up the restricted Redis user for the full token ({e}): scripts it runs may call administrative commands as far as the Redis URL's user may"
                )
            })
            .ok()
    };
    // Connections logged in as a front-made user make it again whenever Redis forgot it (a
    // restart without a saved ACL).
    let mut made_users: Vec<(String, redis::Cmd)> = Vec::new();
    let backend = match full_login {
        None => connect(None, config.redis_connections, wait).await.map_err(unreachable)?,
        Some((login, setuser)) => {
            made_users.push((login.user.clone(), setuser.clone()));
            connect(Some(login), config.redis_connections, wait)
                .await
                .map_err(unreachable)?
                .restore_with(setuser, &killer)
        }
    };
    let readonly = match &config.readonly_token {
        None => None,
        Some(ro) => match restricted_login(&killer, ro, Restriction::ReadOnly, &commands.keyspace_walk_rules()).await {
            Ok((login, setuser)) => {
                made_users.push((login.user.clone(), setuser.clone()));
                let ro = connect(Some(login), config.redis_connections, None).await.map_err(unreachable)?;
                Some(ro.restore_with(setuser, &killer))
            }
            Err(e) => {
                tracing::error!(
                    "the read-only token may not run scripts: cannot set up the restricted Redis user ({e})"
                );
                None
            }
        },
    };
    let (settings, output_limit, run_id) = keep_settings(config, &killer, kill_setting).await;
    Ok(Connected { killer, commands, backend, readonly, made_users, settings, output_limit, run_id })
}

/// Sets Redis's output-buffer limit and its checking of RESTORE payloads, reads its run id and
/// warns if it may evict: the settings to keep on Redis (with `kill_setting`), the output limit
/// in force (0: none) and the run id.
async fn keep_settings(
    config: &Config,
    killer: &backend::Backend,
    kill_setting: Option<redis::Cmd>,
) -> (Vec<redis::Cmd>, usize, Option<String>) {
    // A restarted Redis has its own settings again: set them on every new connection.
    let output_limit = config.redis_output_limit_bytes.unwrap_or(config.max_response_bytes.max(1024) + (1 << 20));
    let output_set = bound_output_buffers(killer, output_limit).await;
    let run_id = if config.cluster { None } else { crate::driver::run_id(killer).await };
    warn_if_evicting(killer).await;
    let output_limit = if output_set.is_some() { output_limit } else { 0 };
    let sanitize = sanitize_restores(killer).await;
    (kill_setting.into_iter().chain(output_set).chain(sanitize).collect(), output_limit, run_id)
}

/// One connection of the URL's own user, for the front itself (the script watchdog's).
pub(crate) async fn own_connection(config: &Config) -> Result<backend::Backend, String> {
    let max_reply = config.max_response_bytes.max(1024);
    backend::Backend::connect(&config.redis, config.cluster, config.timeout(), None, 1, max_reply, None)
        .await
        .map_err(|e| format!("cannot reach Redis at {}: {e}", backend::redact(&config.redis)))
}
