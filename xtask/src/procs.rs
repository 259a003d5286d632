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

/// Starts redcount-rest from `bin_dir` before `redis_url` with `token`.
pub fn rest_front(bin_dir: &Path, redis_url: &str, token: &str, extra: &[&str]) -> Result<(Guard, u16), String> {
    let port = free_port();
    let mut cmd = redcount_procs::rest_front_command(bin_dir, port, redis_url, extra);
    let mut g = Guard::spawn("redcount-rest", cmd.env("REDCOUNT_REST_TOKEN", token))?;
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
