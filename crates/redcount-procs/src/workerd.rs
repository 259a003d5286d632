//! Workers served by workerd directly (the binary wrangler runs, from its npm package), for
//! the benchmark and the tests: no `wrangler dev` (whose local Node.js proxy caps every worker
//! at a few hundred requests per second and takes seconds to start) in front.
//!
//! A worker is described the way wrangler sees it, by a directory with its `wrangler.toml` and
//! `.dev.vars`; its bundle is the one `wrangler deploy --dry-run` makes (what would be
//! uploaded). Several workers go in one config ([`config`]) and reach each other through
//! Service bindings (RPC included, with `props`), as on Cloudflare.
//!
//! ```no_run
//! use redcount_procs::workerd::{Binding, Worker, config};
//! # let (root, dir) = (std::path::Path::new("."), std::path::Path::new("examples/caller-worker"));
//! let mut caller = Worker::from_dir(root, dir, &dir.join("bundle")).unwrap();
//! caller.bindings.push(Binding::service("REDCOUNT", "redcount", Some("Redcount"), Some(r#"{"namespace":"acme"}"#)));
//! let text = config(&[(&caller, Some(8787))]);
//! assert!(text.contains("entrypoint = \"Redcount\""));
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workerd binary wrangler itself runs (npm `@cloudflare/workerd-linux-64`, pinned by
/// package-lock.json through wrangler), under the repository's `root`.
pub fn binary(root: &Path) -> PathBuf {
    root.join("node_modules/@cloudflare/workerd-linux-64/bin/workerd")
}

/// Bundles the worker of `dir` (its `wrangler.toml`) with `wrangler deploy --dry-run` into
/// `out`, offline and without an account. Returns the modules' file names, the entry point
/// (named after `main`) first.
pub fn bundle(root: &Path, dir: &Path, out: &Path) -> Result<Vec<String>, String> {
    let _ = std::fs::remove_dir_all(out);
    let status = Command::new(root.join("node_modules/.bin/wrangler"))
        .current_dir(dir)
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(out)
        .arg("--config")
        .arg(dir.join("wrangler.toml"))
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_HIDE_BANNER", "true")
        .env("FORCE_COLOR", "0")
        .env_remove("CLOUDFLARE_API_TOKEN")
        .env_remove("CLOUDFLARE_ACCOUNT_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run wrangler: {e}"))?;
    if !status.success() {
        return Err(format!("wrangler deploy --dry-run failed for {}", dir.display()));
    }
    let toml = std::fs::read_to_string(dir.join("wrangler.toml")).map_err(|e| e.to_string())?;
    let main = parse_wrangler_toml(&toml)?.main;
    let stem = Path::new(&main).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let entry = format!("{stem}.js");
    let mut modules: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".js") || n.ends_with(".mjs") || n.ends_with(".wasm"))
        .collect();
    modules.sort_by_key(|m| (*m != entry, m.clone()));
    if modules.first() != Some(&entry) {
        return Err(format!("no {entry} in {}", out.display()));
    }
    Ok(modules)
}

/// What workerd needs from a `wrangler.toml`: `main`, the compatibility date and flags and the
/// `[vars]` (strings; `'''` multi-line ones included).
#[derive(Debug, Default, PartialEq)]
pub struct WranglerToml {
    /// `main`.
    pub main: String,
    /// `compatibility_date`.
    pub compatibility_date: String,
    /// `compatibility_flags`.
    pub compatibility_flags: Vec<String>,
    /// `[vars]`, in order.
    pub vars: Vec<(String, String)>,
    /// `[assets]`: the binding's name (when the worker reads them) and the directory.
    pub assets: Option<(Option<String>, String)>,
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(v)
        .to_string()
}

/// Reads the parts of `wrangler.toml` workerd needs (the subset of TOML wrangler configs use:
/// strings, string arrays, `'''` multi-line strings, `#` comments).
pub fn parse_wrangler_toml(text: &str) -> Result<WranglerToml, String> {
    let mut out = WranglerToml::default();
    let mut table = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.starts_with('[') {
            table = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
            continue;
        }
        let Some((key, value)) = t.split_once('=') else { continue };
        let (key, value) = (key.trim(), value.trim());
        // A multi-line literal string: everything up to the closing '''.
        let value = if let Some(rest) = value.strip_prefix("'''") {
            let mut s = rest.strip_prefix('\n').unwrap_or(rest).to_string();
            if let Some(end) = s.find("'''") {
                s.truncate(end);
            } else {
                loop {
                    let next = lines.next().ok_or_else(|| format!("{key}: ''' is never closed"))?;
                    if let Some(end) = next.find("'''") {
                        if !s.is_empty() {
                            s.push('\n');
                        }
                        s.push_str(&next[..end]);
                        break;
                    }
                    if !s.is_empty() {
                        s.push('\n');
                    }
                    s.push_str(next);
                }
            }
            s
        } else {
            // A comment may follow a one-line value.
            let v = match value.find(" #") {
                Some(i) if !value.starts_with('[') => &value[..i],
                _ => value,
            };
            unquote(v)
        };
        match (table.as_str(), key) {
            ("", "main") => out.main = value,
            ("", "compatibility_date") => out.compatibility_date = value,
            ("", "compatibility_flags") => {
                out.compatibility_flags = value
                    .trim_matches(|c| c == '[' || c == ']')
                    .split(',')
                    .map(unquote)
                    .filter(|f| !f.is_empty())
                    .collect()
            }
            ("vars", k) => out.vars.push((unquote(k), value)),
            ("assets", "directory") => out.assets.get_or_insert((None, String::new())).1 = value,
            ("assets", "binding") => out.assets.get_or_insert((None, String::new())).0 = Some(value),
            _ => {}
        }
    }
    if out.compatibility_date.is_empty() {
        return Err("wrangler.toml has no compatibility_date".into());
    }
    Ok(out)
}

/// `.dev.vars` (`NAME=value` lines) as pairs.
pub fn parse_dev_vars(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), unquote(v)))
        .collect()
}

/// A capnp text literal.
fn capnp_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A binding of a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Binding {
    /// A text var or secret.
    Text(String, String),
    /// A Service binding to another worker of the config: its default entry point or a named
    /// one (a `WorkerEntrypoint` class), with `props` (JSON) the callee reads in `ctx.props`.
    Service {
        /// The binding's name.
        name: String,
        /// The worker called.
        service: String,
        /// Its entry point (`None`: the default export).
        entrypoint: Option<String>,
        /// The props, as JSON.
        props: Option<String>,
    },
    /// A directory served as static files (what `[assets]` gives a worker as `env.ASSETS`).
    Disk(String, PathBuf),
}

impl Binding {
    /// A Service binding.
    pub fn service(name: &str, service: &str, entrypoint: Option<&str>, props: Option<&str>) -> Binding {
        Binding::Service {
            name: name.into(),
            service: service.into(),
            entrypoint: entrypoint.map(Into::into),
            props: props.map(Into::into),
        }
    }
}

/// One worker of a config.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Its service name (what bindings name).
    pub name: String,
    /// The directory of its bundle.
    pub bundle: PathBuf,
    /// The bundle's modules, the entry point first.
    pub modules: Vec<String>,
    /// `compatibility_date`.
    pub compatibility_date: String,
    /// `compatibility_flags`.
    pub compatibility_flags: Vec<String>,
    /// Its bindings.
    pub bindings: Vec<Binding>,
}

impl Worker {
    /// The worker of `dir` (its `wrangler.toml`, whose `name` it takes, and `.dev.vars`),
    /// bundled into `out`: its vars and secrets as text bindings, its `[assets]` binding as a
    /// directory; other bindings are added by the caller.
    pub fn from_dir(root: &Path, dir: &Path, out: &Path) -> Result<Worker, String> {
        let read =
            |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| format!("{}: {e}", dir.join(f).display()));
        let text = read("wrangler.toml")?;
        let toml = parse_wrangler_toml(&text)?;
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name").and_then(|v| v.trim().strip_prefix('=')).map(unquote))
            .ok_or("wrangler.toml has no name")?;
        let secrets = parse_dev_vars(&read(".dev.vars").unwrap_or_default());
        let modules = bundle(root, dir, out)?;
        let mut bindings: Vec<Binding> =
            toml.vars.into_iter().chain(secrets).map(|(k, v)| Binding::Text(k, v)).collect();
        if let Some((Some(name), directory)) = toml.assets {
            bindings.push(Binding::Disk(name, dir.join(directory)));
        }
        Ok(Worker {
            name,
            bundle: out.to_path_buf(),
            modules,
            compatibility_date: toml.compatibility_date,
            compatibility_flags: toml.compatibility_flags,
            bindings,
        })
    }
}

/// The workerd config serving `workers`, each on `127.0.0.1:port` when it has a port; their
/// modules are read from `<config dir>/<worker name>/` ([`write()`] copies them there).
/// Outbound fetches may reach loopback and private addresses (the REST front).
pub fn config(workers: &[(&Worker, Option<u16>)]) -> String {
    let mut services = Vec::new();
    let mut sockets = Vec::new();
    let mut consts = Vec::new();
    for (i, (w, port)) in workers.iter().enumerate() {
        services.push(format!("    (name = {}, worker = .w{i}),\n", capnp_str(&w.name)));
        if let Some(port) = port {
            sockets.push(format!(
                "(name = {}, address = \"127.0.0.1:{port}\", http = (), service = {})",
                capnp_str(&format!("http-{}", w.name)),
                capnp_str(&w.name)
            ));
        }
        let modules: Vec<String> = w
            .modules
            .iter()
            .map(|m| {
                let kind = if m.ends_with(".wasm") { "wasm" } else { "esModule" };
                let path = format!("{}/{m}", w.name);
                format!("      (name = {}, {kind} = embed {}),\n", capnp_str(m), capnp_str(&path))
            })
            .collect();
        let bindings: Vec<String> = w
            .bindings
            .iter()
            .map(|b| match b {
                Binding::Text(k, v) => format!("      (name = {}, text = {}),\n", capnp_str(k), capnp_str(v)),
                Binding::Service { name, service, entrypoint, props } => {
                    let mut target = format!("name = {}", capnp_str(service));
                    if let Some(e) = entrypoint {
                        target.push_str(&format!(", entrypoint = {}", capnp_str(e)));
                    }
                    if let Some(p) = props {
                        target.push_str(&format!(", props = (json = {})", capnp_str(p)));
                    }
                    format!("      (name = {}, service = ({target})),\n", capnp_str(name))
                }
                Binding::Disk(name, _) => {
                    format!("      (name = {}, service = {}),\n", capnp_str(name), capnp_str(&disk_name(w, name)))
                }
            })
            .collect();
        for b in &w.bindings {
            if let Binding::Disk(name, path) = b {
                services.push(format!(
                    "    (name = {}, disk = (path = {}, writable = false)),\n",
                    capnp_str(&disk_name(w, name)),
                    capnp_str(&path.display().to_string())
                ));
            }
        }
        let flags: Vec<String> = w.compatibility_flags.iter().map(|f| capnp_str(f)).collect();
        consts.push(format!(
            "const w{i} :Workerd.Worker = (\n  modules = [\n{}  ],\n  compatibilityDate = {},\n  compatibilityFlags = [{}],\n  bindings = [\n{}  ],\n);\n",
            modules.concat(),
            capnp_str(&w.compatibility_date),
            flags.join(", "),
            bindings.concat()
        ));
    }
    format!(
        "# Generated from the workers' wrangler.toml and .dev.vars; do not edit.\n\
         using Workerd = import \"/workerd/workerd.capnp\";\n\n\
         const config :Workerd.Config = (\n  services = [\n{}    (name = \"internet\", network = (allow = [\"public\", \"private\", \"local\"])),\n  ],\n  sockets = [{}],\n);\n\n{}",
        services.concat(),
        sockets.join(", "),
        consts.join("\n")
    )
}

fn disk_name(w: &Worker, binding: &str) -> String {
    format!("{}-{}", w.name, binding.to_ascii_lowercase())
}

/// Writes the config of `workers` to `dir/workerd.capnp`, each worker's modules copied
/// beside it; returns the config's path.
pub fn write(dir: &Path, workers: &[(&Worker, Option<u16>)]) -> Result<PathBuf, String> {
    for (w, _) in workers {
        let to = dir.join(&w.name);
        std::fs::create_dir_all(&to).map_err(|e| e.to_string())?;
        for m in &w.modules {
            std::fs::copy(w.bundle.join(m), to.join(m)).map_err(|e| format!("{m}: {e}"))?;
        }
    }
    let path = dir.join("workerd.capnp");
    std::fs::write(&path, config(workers)).map_err(|e| e.to_string())?;
    Ok(path)
}

/// `workerd serve` of the config at `path`, its output to `log` (or nowhere).
pub fn command(root: &Path, path: &Path, log: Option<&Path>) -> Result<Command, String> {
    let mut cmd = Command::new(binary(root));
    cmd.arg("serve").arg(path).stdin(Stdio::null());
    match log {
        Some(log) => {
            let f = std::fs::File::create(log).map_err(|e| e.to_string())?;
            cmd.stdout(f.try_clone().map_err(|e| e.to_string())?).stderr(f);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_workerd_needs_from_wrangler_toml() {
        let t = parse_wrangler_toml(
            "name = \"x\"\nmain = \"a.js\"\ncompatibility_date = \"2025-09-01\" # pinned\n\
             compatibility_flags = [\"nodejs_compat\", 'other']\n[build]\ncommand = \"cargo\"\n\
             [vars]\nPOLICIES = '''\n{\n  \"a\": 1\n}\n'''\nNAME = \"shop\" # a comment\nONE = '''{}'''\n\
             [assets]\ndirectory = \"www\"\nbinding = \"ASSETS\"\n",
        )
        .unwrap();
        assert_eq!(t.assets, Some((Some("ASSETS".into()), "www".into())));
        assert_eq!(t.main, "a.js");
        assert_eq!(t.compatibility_date, "2025-09-01");
        assert_eq!(t.compatibility_flags, ["nodejs_compat", "other"]);
        assert_eq!(
            t.vars,
            [
                ("POLICIES".into(), "{\n  \"a\": 1\n}\n".into()),
                ("NAME".into(), "shop".into()),
                ("ONE".into(), "{}".into())
            ]
        );
        assert!(parse_wrangler_toml("name = \"x\"").is_err());
    }

    #[test]
    fn writes_a_capnp_config_with_escaped_bindings() {
        let w = Worker {
            name: "redcount".into(),
            bundle: PathBuf::from("/nowhere"),
            modules: vec!["index.js".into(), "x-m.wasm".into()],
            compatibility_date: "2025-09-01".into(),
            compatibility_flags: vec![],
            bindings: [("P", "{\"a\":\n1}"), ("TOKEN", "abc")]
                .into_iter()
                .map(|(k, v)| Binding::Text(k.into(), v.into()))
                .chain([Binding::Disk("ASSETS".into(), PathBuf::from("/srv/www"))])
                .collect(),
        };
        let caller = Worker {
            name: "caller".into(),
            bindings: vec![Binding::service("REDCOUNT", "redcount", Some("Redcount"), Some(r#"{"admin":true}"#))],
            ..w.clone()
        };
        let c = config(&[(&w, Some(8123)), (&caller, None)]);
        assert!(c.contains(r#"(name = "index.js", esModule = embed "redcount/index.js")"#), "{c}");
        assert!(c.contains(r#"(name = "x-m.wasm", wasm = embed "redcount/x-m.wasm")"#), "{c}");
        assert!(c.contains(r#"(name = "P", text = "{\"a\":\n1}")"#), "{c}");
        assert!(c.contains(r#"(name = "TOKEN", text = "abc")"#), "{c}");
        assert!(c.contains(r#"(name = "ASSETS", service = "redcount-assets")"#), "{c}");
        assert!(c.contains(r#"(name = "redcount-assets", disk = (path = "/srv/www", writable = false))"#), "{c}");
        assert!(
            c.contains(
                r#"service = (name = "redcount", entrypoint = "Redcount", props = (json = "{\"admin\":true}"))"#
            ),
            "{c}"
        );
        assert!(c.contains("127.0.0.1:8123") && !c.contains("http-caller"), "{c}");
    }

    #[test]
    fn parses_dev_vars() {
        assert_eq!(
            parse_dev_vars("TOKEN=abc\n# no\nB = \"c\"\n"),
            [("TOKEN".into(), "abc".into()), ("B".into(), "c".into())]
        );
    }
}
