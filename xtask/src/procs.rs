//! The xtask's children (redis-server, redcount-rest, wrangler), started through
//! `redcount-procs`, which the tests use too: process groups stopped on drop and on Ctrl-C.

use std::path::Path;
use std::time::Duration;

pub use redcount_procs::{Proc as Guard, free_port, wait_port};

/// A random secret (128 bits from the OS) as hex.
pub fn secret() -> Result<String, String> {
    Ok(redcount_procs::secret(""))
}

/// Starts a throw-away redis-server on a free port.
pub fn redis_server(dir: &Path) -> Result<(Guard, u16), String> {
    let port = free_port();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut g = Guard::spawn("redis-server", &mut redcount_procs::redis_command(port, dir, &[]))?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts a throw-away replica of the Redis on `master_port`, on a free port.
pub fn redis_replica(dir: &Path, master_port: u16) -> Result<(Guard, u16), String> {
    let port = free_port();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let master = master_port.to_string();
    let args = ["--replicaof", "127.0.0.1", master.as_str()];
    let mut g = Guard::spawn("redis-server", &mut redcount_procs::redis_command(port, dir, &args))?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts redcount-rest from `bin_dir` before `redis_url` with `token`.
pub fn rest_front(bin_dir: &Path, redis_url: &str, token: &str, extra: &[&str]) -> Result<(Guard, u16), String> {
    let port = free_port();
    let mut cmd = redcount_procs::rest_front_command(bin_dir, port, redis_url, extra);
    let mut g = Guard::spawn("redcount-rest", cmd.env("REDCOUNT_REST_TOKEN", token))?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts webdis (Debian's package; installed when missing) on a free loopback port in front
/// of the Redis on `redis_port`, with a config of its own in `dir`: one worker thread, as the
/// benchmark runs redcount-rest.
pub fn webdis(dir: &Path, redis_port: u16) -> Result<(Guard, u16), String> {
    if !crate::setup::have("webdis") {
        crate::setup::apt_install(&["webdis"])?;
    }
    let port = free_port();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let config = dir.join("webdis.json");
    std::fs::write(
        &config,
        format!(
            "{{\"redis_host\": \"127.0.0.1\", \"redis_port\": {redis_port}, \"http_host\": \"127.0.0.1\", \
             \"http_port\": {port}, \"threads\": 1, \"daemonize\": false, \"database\": 0, \"verbosity\": 0, \
             \"logfile\": \"{}\"}}\n",
            dir.join("webdis.log").display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut g = Guard::spawn("webdis", std::process::Command::new("webdis").arg(&config))?;
    wait_port(port, Duration::from_secs(10), &mut g)?;
    Ok((g, port))
}

/// Starts `wrangler dev` on a config directory of its own (wrangler.toml + .dev.vars there).
pub fn wrangler(dir: &Path) -> Result<(Guard, u16), String> {
    let port = free_port();
    let mut cmd = redcount_procs::wrangler_command(&crate::setup::root(), dir, port)?;
    let mut g = Guard::spawn("wrangler dev", &mut cmd)?;
    wait_port(port, Duration::from_secs(180), &mut g)?;
    Ok((g, port))
}
