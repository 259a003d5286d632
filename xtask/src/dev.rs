//! `cargo xtask dev`: Redis + redcount-rest + the worker under wrangler dev + the demo page.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::procs::{self, Guard};
use crate::setup::{self, root};

pub fn dev() -> Result<(), String> {
    setup::ensure_test_deps()?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).map_err(|e| e.to_string())?;
    }
    let bins = setup::build_bins(false)?;
    crate::worker::build()?;
    let work = setup::target_dir().join("dev");

    // Redis: the user's (REDIS_URL), or our own on a free port.
    let mut guards: Vec<Guard> = Vec::new();
    let redis_url = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            let (g, port) = procs::redis_server(&work.join("redis"))?;
            guards.push(g);
            format!("redis://127.0.0.1:{port}")
        }
    };
    let rest_token = procs::secret()?;
    let (front, front_port) = procs::rest_front(&bins, &redis_url, &rest_token, &[])?;
    guards.push(front);
    let admin_token = procs::secret()?;
    write_dev_vars(&root().join(".dev.vars"), &format!("http://127.0.0.1:{front_port}"), &rest_token, &admin_token)?;

    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(8787);
    let inspector = procs::free_port();
    let mut wrangler = Guard::spawn(
        "wrangler dev",
        Command::new(root().join("node_modules/.bin/wrangler"))
            .args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string(), "--inspector-port", &inspector.to_string()])
            .current_dir(root())
            .env("WRANGLER_SEND_METRICS", "false"),
    )?;
    procs::wait_port(port, Duration::from_secs(180), &mut wrangler)?;
    guards.push(wrangler);
    println!();
    println!("  redcount is running: http://127.0.0.1:{port}/");
    println!("  API:        http://127.0.0.1:{port}/api/policies");
    println!("  REST front: http://127.0.0.1:{front_port} before {}", redact(&redis_url));
    println!("  Tokens (REST, admin) are in .dev.vars (gitignored). Ctrl-C stops everything.");
    println!();
    while !stop.load(Ordering::SeqCst) {
        if let Some(name) = guards.iter_mut().find_map(|g| (!g.alive()).then(|| g.name.clone())) {
            drop(guards);
            return Err(format!("{name} exited; everything was stopped"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("\nxtask: stopping wrangler, redcount-rest and redis-server");
    drop(guards);
    Ok(())
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// `.dev.vars`: the worker's secrets for wrangler dev, readable by the owner only.
fn write_dev_vars(path: &Path, rest_url: &str, rest_token: &str, admin_token: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(
        f,
        "# Written by `cargo xtask dev`; not committed.\nREDCOUNT_REST_URL={rest_url}\nREDCOUNT_REST_TOKEN={rest_token}\nREDCOUNT_ADMIN_TOKEN={admin_token}"
    )
    .map_err(|e| e.to_string())
}
