//! `cargo xtask deploy [--dry-run]`: the worker to Cloudflare, with the pinned wrangler.
//!
//! Both build the worker with [`worker::build`] (which fails over the size limit), then run
//! `wrangler deploy` on a copy of `wrangler.toml` in `target/deploy/`: without its `[build]`
//! table (the worker was just built; wrangler would build it again) and with `main` and the
//! assets directory made absolute. No other path in `wrangler.toml` is rewritten.
//!
//! wrangler's dry run needs no account and no network (checked in a network namespace):
//! Cloudflare credentials are removed from its environment, its banner (whose update check asks
//! the npm registry) and telemetry are off, and the bundle goes to `target/deploy/out/`. Secrets are never sent by this task:
//! they are Cloudflare secrets (`wrangler secret put`). `wrangler deploy` does not read
//! `.dev.vars` (and none lies beside the copied config); its values, and those of the
//! credential variables, are blanked out of anything wrangler prints all the same.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::setup::{self, root};
use crate::worker::{self, MAX_BUNDLE_GZ};

/// Variables that hold secrets: refused under `[vars]`, blanked out of wrangler's output.
const SECRET_VARS: [&str; 3] = ["REDCOUNT_REST_TOKEN", "REDCOUNT_ADMIN_TOKEN", "REDCOUNT_ID_SECRET"];

/// How wrangler finds an account: removed for the dry run.
const CLOUDFLARE_VARS: [&str; 4] =
    ["CLOUDFLARE_API_TOKEN", "CLOUDFLARE_API_KEY", "CLOUDFLARE_EMAIL", "CLOUDFLARE_ACCOUNT_ID"];

pub fn deploy(args: &[String]) -> Result<(), String> {
    let dry_run = match args {
        [] => false,
        [a] if a == "--dry-run" => true,
        _ => return Err("deploy takes only --dry-run".into()),
    };
    if !dry_run && std::env::var("CLOUDFLARE_API_TOKEN").map_or(true, |t| t.trim().is_empty()) {
        return Err("`cargo xtask deploy` needs CLOUDFLARE_API_TOKEN (a Cloudflare API token made from the \
                    \"Edit Cloudflare Workers\" template; also CLOUDFLARE_ACCOUNT_ID if it reaches several \
                    accounts); `cargo xtask deploy --dry-run` needs none"
            .into());
    }
    let (raw, gz) = worker::build()?;

    let dir = setup::target_dir().join("deploy");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let source = std::fs::read_to_string(root().join("wrangler.toml")).map_err(|e| format!("wrangler.toml: {e}"))?;
    let config = dir.join("wrangler.toml");
    std::fs::write(&config, deploy_config(&source, &root())?).map_err(|e| format!("{}: {e}", config.display()))?;

    let mut cmd = Command::new(root().join("node_modules/.bin/wrangler"));
    cmd.current_dir(&dir)
        .arg("deploy")
        .arg("--config")
        .arg(&config)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_HIDE_BANNER", "true")
        .env("FORCE_COLOR", "0");
    if dry_run {
        let out = dir.join("out");
        let _ = std::fs::remove_dir_all(&out);
        cmd.arg("--dry-run").arg("--outdir").arg(&out).stdin(Stdio::null());
        for var in CLOUDFLARE_VARS {
            cmd.env_remove(var);
        }
        eprintln!("xtask: wrangler deploy --dry-run (offline; bundle in {})", out.display());
    } else {
        eprintln!("xtask: wrangler deploy");
    }
    let upload = run_wrangler(&mut cmd, &secrets())?;

    let kib = |b: u64| b as f64 / 1024.0;
    match upload {
        Some((w_raw, w_gz)) => {
            println!("upload size, as wrangler counts it: {w_raw:.2} KiB, {w_gz:.2} KiB gzipped");
            println!(
                "worker bundle, as build-worker counts it: {:.2} KiB, {:.2} KiB gzipped (gzip -9 per file; limit {} KiB)",
                kib(raw),
                kib(gz),
                MAX_BUNDLE_GZ / 1024
            );
            if w_gz > kib(MAX_BUNDLE_GZ) {
                eprintln!("xtask: warning: wrangler's gzipped upload is over the {} KiB limit", MAX_BUNDLE_GZ / 1024);
            }
        }
        None if dry_run => return Err("wrangler printed no \"Total Upload: … KiB / gzip: … KiB\" line".into()),
        None => eprintln!("xtask: wrangler printed no upload size"),
    }
    Ok(())
}

/// `wrangler.toml` for the copy in `target/deploy/`: the `[build]` table dropped, `main` and
/// `[assets] directory` absolute. Refuses a secret under `[vars]` (it would be uploaded and
/// printed as plain text), naming the variable only.
fn deploy_config(source: &str, root: &Path) -> Result<String, String> {
    let mut out = String::new();
    let mut table = String::new();
    let mut in_multiline = false;
    let mut has_main = false;
    for line in source.lines() {
        let t = line.trim();
        if !in_multiline && let Some(name) = table_header(t) {
            table = name;
        }
        let starts_multiline = (t.matches("'''").count() + t.matches("\"\"\"").count()) % 2 == 1;
        let key = if in_multiline { None } else { t.split_once('=').map(|(k, v)| (k.trim(), v.trim())) };
        in_multiline ^= starts_multiline;
        if table == "build" || table.starts_with("build.") {
            continue;
        }
        match key {
            Some(("main", v)) if table.is_empty() => {
                out += &format!("main = {}\n", toml_path(&root.join(unquote(v))));
                has_main = true;
            }
            Some(("directory", v)) if table == "assets" => {
                out += &format!("directory = {}\n", toml_path(&root.join(unquote(v))));
            }
            Some((k, _)) if table == "vars" && SECRET_VARS.contains(&unquote(k)) => {
                return Err(format!(
                    "wrangler.toml sets {k} under [vars]: it is a secret; remove it there and use \
                     `npx wrangler secret put {k}`"
                ));
            }
            _ => {
                out += line;
                out.push('\n');
            }
        }
    }
    if has_main { Ok(out) } else { Err("wrangler.toml has no top-level `main`".into()) }
}

/// `[name]` or `[[name]]` (a comment may follow): the table's name. A line inside a multi-line
/// array (`[1, 2],`) is none.
fn table_header(t: &str) -> Option<String> {
    let t = t.split('#').next()?.trim();
    let inner = t.strip_prefix('[')?.strip_suffix(']')?;
    let inner = inner.strip_prefix('[').and_then(|i| i.strip_suffix(']')).unwrap_or(inner).trim();
    let key_char = |c: char| c.is_ascii_alphanumeric() || "_-. \"'".contains(c);
    (!inner.is_empty() && inner.chars().all(key_char)).then(|| inner.to_string())
}

fn unquote(v: &str) -> &str {
    v.trim().trim_matches(['"', '\''])
}

fn toml_path(p: &Path) -> String {
    format!("\"{}\"", p.display().to_string().replace('\\', "\\\\").replace('"', "\\\""))
}

/// The values to blank out of wrangler's output: `.dev.vars`'s and the secret and credential
/// variables' in this environment (8 characters or more: shorter ones are no secrets, and
/// would blank out ordinary words).
fn secrets() -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    if let Ok(text) = std::fs::read_to_string(root().join(".dev.vars")) {
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            if let Some((_, v)) = line.split_once('=') {
                values.push(unquote(v).to_string());
            }
        }
    }
    for var in SECRET_VARS.iter().chain(&CLOUDFLARE_VARS[..2]) {
        if let Ok(v) = std::env::var(var) {
            values.push(v.trim().to_string());
        }
    }
    values.retain(|v| v.len() >= 8);
    values
}

fn scrub(line: &str, secrets: &[String]) -> String {
    let mut line = line.to_string();
    for s in secrets {
        if line.contains(s.as_str()) {
            line = line.replace(s.as_str(), "[secret]");
        }
    }
    line
}

/// Runs wrangler, echoing its output (secrets blanked out), and returns the size its
/// "Total Upload: X KiB / gzip: Y KiB" line reports.
fn run_wrangler(cmd: &mut Command, secrets: &[String]) -> Result<Option<(f64, f64)>, String> {
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| {
            format!("cannot run wrangler ({}): {e}", root().join("node_modules/.bin/wrangler").display())
        })?;
    let stderr = child.stderr.take().unwrap();
    let err_secrets = secrets.to_vec();
    let err_thread = std::thread::spawn(move || echo(stderr, &err_secrets, true));
    let upload = echo(child.stdout.take().unwrap(), secrets, false);
    let err_upload = err_thread.join().unwrap_or(None);
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("wrangler deploy failed ({status})"));
    }
    Ok(upload.or(err_upload))
}

fn echo(from: impl Read, secrets: &[String], to_stderr: bool) -> Option<(f64, f64)> {
    let mut upload = None;
    for line in BufReader::new(from).lines().map_while(Result::ok) {
        let line = scrub(&strip_ansi(&line), secrets);
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        upload = upload.or_else(|| parse_upload(&line));
    }
    upload
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then one final byte in @..~.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `Total Upload: 392.42 KiB / gzip: 144.69 KiB` → (392.42, 144.69).
fn parse_upload(line: &str) -> Option<(f64, f64)> {
    let rest = line.split_once("Total Upload:")?.1;
    let (raw, gz) = rest.split_once("/ gzip:")?;
    let num = |s: &str| s.trim().strip_suffix("KiB")?.trim().parse::<f64>().ok();
    Some((num(raw)?, num(gz)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wranglers_size_line() {
        assert_eq!(parse_upload("Total Upload: 392.42 KiB / gzip: 144.69 KiB"), Some((392.42, 144.69)));
        let colored = "Total Upload: \u{1b}[32m392.42 KiB / gzip: 144.69 KiB\u{1b}[39m";
        assert_eq!(parse_upload(&strip_ansi(colored)), Some((392.42, 144.69)));
        assert_eq!(parse_upload("Uploaded redcount"), None);
    }

    #[test]
    fn config_copy_drops_build_and_makes_paths_absolute() {
        let src = "name = \"redcount\"\nmain = \"crates/w/build/index.js\"\n\n[build]\ncommand = \"cargo xtask build-worker\"\n\n\
                   [assets]\ndirectory = \"www\"\n\n[vars]\nP = '''\n[\n  {\"a\": 1}\n]\n'''\nQ = \"x\"\n";
        let out = deploy_config(src, Path::new("/r")).unwrap();
        assert!(!out.contains("[build]") && !out.contains("command"), "{out}");
        assert!(out.contains("main = \"/r/crates/w/build/index.js\""), "{out}");
        assert!(out.contains("directory = \"/r/www\""), "{out}");
        // A `[` inside a multi-line string is no table header.
        assert!(out.contains("P = '''\n[\n  {\"a\": 1}\n]\n'''\nQ = \"x\"\n"), "{out}");
    }

    #[test]
    fn refuses_a_secret_under_vars_without_printing_it() {
        let src = "main = \"x.js\"\n[vars]\nREDCOUNT_ADMIN_TOKEN = \"supersecretvalue123\"\n";
        let e = deploy_config(src, Path::new("/r")).unwrap_err();
        assert!(e.contains("REDCOUNT_ADMIN_TOKEN") && !e.contains("supersecretvalue123"), "{e}");
    }

    #[test]
    fn blanks_secrets() {
        let s = vec!["abcdefgh12345678".to_string()];
        assert_eq!(scrub("token abcdefgh12345678 here", &s), "token [secret] here");
    }
}
