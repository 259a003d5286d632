//! `cargo xtask compat`: the official clients' own test suites against redcount-rest.
//!
//! The @upstash/redis repository's `bun test` and upstash-redis-py's pytest suite, each at a
//! pinned commit, run against a throw-away redis-server behind a freshly built
//! `redcount-rest`. Every failure is looked up in `tests/compat/expected.toml`, which says
//! why it fails: the local Redis lacks the command (`redis-lacks`), the feature exists on
//! Upstash only (`upstash-only`), or the front answers otherwise than the client expects
//! (`front-differs`). A failure that file does not name is flagged as unclassified and makes
//! the task fail. Not part of `cargo xtask test` or CI: it takes minutes. See COMPAT.md.
//!
//! Everything it fetches or installs lives under `target/compat/` (never committed): the
//! suites' sources (git, by commit), bun (from npm), a Python venv with pytest and the
//! client's test dependencies (from PyPI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{self, Guard};
use crate::setup::{self, have, root, run};

/// The @upstash/redis repository (the client's sources and its tests), and the commit run.
const REDIS_JS: Source = Source {
    repo: "upstash/redis-js",
    commit: "777dc30585ae61e5826bb95f5a957e6dea277900",
    version: "@upstash/redis 1.38.2+ (main, published as 1.38.3-canary-20260807072941-777dc305)",
    env: "REDCOUNT_COMPAT_REDIS_JS_GIT",
};

/// upstash-redis-py, and the commit run.
const REDIS_PY: Source = Source {
    repo: "upstash/redis-py",
    commit: "e3379e95c2b5f8c6f6627ebb3083de01bcbea27d",
    version: "upstash-redis 1.6.0",
    env: "REDCOUNT_COMPAT_REDIS_PY_GIT",
};

/// bun, from its npm package (the binary ships in `@oven/bun-linux-x64`).
const BUN_VERSION: &str = "1.4.5";

/// What the Python client's tests import (its pyproject's dev group, pinned), plus its one
/// runtime dependency.
const PY_REQUIREMENTS: &[&str] = &["httpx==0.28.1", "pytest==8.3.4", "pytest-asyncio==0.24.0", "python-dotenv==1.0.1"];

/// Longest a whole suite may run before it is stopped (its results so far are lost).
const SUITE_TIMEOUT: Duration = Duration::from_secs(40 * 60);

#[derive(Debug)]
struct Source {
    repo: &'static str,
    commit: &'static str,
    version: &'static str,
    /// Environment variable naming another git URL or local clone to fetch the commit from.
    env: &'static str,
}

const HELP: &str = "cargo xtask compat [js|py]: run both suites (the default) or one";

/// `cargo xtask compat [js|py]`
pub fn compat(args: &[String]) -> Result<(), String> {
    let (js, py) = match args.first().map(String::as_str) {
        None | Some("all") => (true, true),
        Some("js") => (true, false),
        Some("py") => (false, true),
        Some(other) => return Err(format!("unknown suite `{other}`; {HELP}")),
    };
    let expected = Expected::load(&root().join("tests/compat/expected.toml"))?;
    let work = setup::target_dir().join("compat");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;

    // Install and fetch everything first, so a missing tool fails before minutes of tests.
    setup::ensure_redis()?;
    let js_ready = if js { Some(prepare_js(&work)?) } else { None };
    let py_ready = if py { Some(prepare_py(&work)?) } else { None };
    run(setup::cargo().args(["build", "--bins", "-p", "redcount-front"]))?;
    let bins = setup::target_dir().join("debug");

    let mut reports = Vec::new();
    if let Some((dir, bun)) = js_ready {
        let outcome = run_suite(&work.join("run/js"), &bins, expected.entries("js"), Naming::Suites, |out| {
            let mut cmd = Command::new(&bun);
            cmd.args(["test", "pkg", "--timeout", "20000", "--reporter=junit", "--reporter-outfile"])
                .arg(out)
                .current_dir(dir.join("packages/redis"));
            cmd
        })?;
        reports.push(Report::new("js", &REDIS_JS, outcome, &expected));
    }
    if let Some((dir, python)) = py_ready {
        let outcome = run_suite(&work.join("run/py"), &bins, expected.entries("py"), Naming::Classname, |out| {
            let mut cmd = Command::new(&python);
            cmd.args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "junit_family=xunit1"])
                .arg(format!("--junitxml={}", out.display()))
                .arg("tests")
                .current_dir(&dir);
            cmd
        })?;
        reports.push(Report::new("py", &REDIS_PY, outcome, &expected));
    }

    let mut text = String::new();
    for r in &reports {
        r.write(&mut text);
    }
    let (passed, failed, skipped, unclassified, front) = reports.iter().fold((0, 0, 0, 0, 0), |a, r| {
        (a.0 + r.passed, a.1 + r.failed.len(), a.2 + r.skipped, a.3 + r.unclassified(), a.4 + r.count("front-differs"))
    });
    let lost: usize = reports.iter().map(|r| r.evidence_lost.len()).sum();
    text.push_str(&format!(
        "\ncompat: {front} front-differs, {unclassified} unclassified, {lost} with lost evidence\ncompat: {passed} passed, {failed} failed, {skipped} skipped\n"
    ));
    print!("{text}");
    let summary = work.join("summary.txt");
    std::fs::write(&summary, &text).map_err(|e| format!("{}: {e}", summary.display()))?;
    let mut tsv = String::from("suite\ttest\tclass\tentry\n");
    for r in &reports {
        r.write_tsv(&mut tsv);
    }
    let failures = work.join("failures.tsv");
    std::fs::write(&failures, tsv).map_err(|e| format!("{}: {e}", failures.display()))?;
    eprintln!("xtask: summary written to {}, every failure to {}", summary.display(), failures.display());
    if unclassified > 0 || lost > 0 {
        return Err(format!(
            "{unclassified} failure(s) not classified in tests/compat/expected.toml, {lost} classification(s) whose probe no longer holds"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Installing and fetching.

/// Fetches `src.commit` into `work/src/` once (a shallow fetch of that one commit, or the whole
/// history where the server refuses), from GitHub or from the git URL or path in `src.env`.
fn checkout(work: &Path, src: &Source) -> Result<PathBuf, String> {
    let name = src.repo.rsplit('/').next().unwrap_or(src.repo);
    let dir = work.join("src").join(format!("{name}-{}", &src.commit[..12]));
    let done = dir.with_extension("ok");
    let head = || {
        Command::new("git")
            .arg("-C")
            .arg(&dir)
            .args(["rev-parse", "HEAD"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == src.commit)
    };
    if done.exists() && head() {
        return Ok(dir);
    }
    if !have("git") {
        setup::apt_install(&["git"])?;
    }
    let url = std::env::var(src.env).unwrap_or_else(|_| format!("https://github.com/{}.git", src.repo));
    eprintln!("xtask: fetching {} at {} from {url}", src.repo, src.commit);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.arg("-C").arg(&dir).args(args);
        c
    };
    run(&mut git(&["init", "-q"]))?;
    let shallow = run(&mut git(&["fetch", "-q", "--depth", "1", &url, src.commit]));
    if shallow.is_err() {
        eprintln!("xtask: a shallow fetch of one commit failed; fetching the whole history");
        run(&mut git(&["fetch", "-q", &url, "+refs/heads/*:refs/remotes/origin/*"])).map_err(|e| {
            format!(
                "{e}\ncannot fetch {}: set {} to a git URL or a local clone that has commit {}",
                src.repo, src.env, src.commit
            )
        })?;
    }
    run(&mut git(&["-c", "advice.detachedHead=false", "checkout", "-q", src.commit]))?;
    if !head() {
        return Err(format!("{} is not at {} after the checkout", dir.display(), src.commit));
    }
    std::fs::write(&done, src.commit).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// The redis-js checkout with its runtime dependency installed, and bun.
fn prepare_js(work: &Path) -> Result<(PathBuf, PathBuf), String> {
    if !have("node") || !have("npm") {
        setup::apt_install(&["nodejs", "npm"])?;
    }
    let tools = work.join("bun");
    let bun = tools.join("node_modules/.bin/bun");
    let version = Command::new(&bun).arg("--version").output().ok().map(|o| o.stdout);
    if version.as_deref().map(|v| String::from_utf8_lossy(v).trim().to_string()) != Some(BUN_VERSION.to_string()) {
        eprintln!("xtask: installing bun {BUN_VERSION} from npm");
        std::fs::create_dir_all(&tools).map_err(|e| e.to_string())?;
        run(Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&tools)
            .arg(format!("bun@{BUN_VERSION}")))?;
    }
    let dir = checkout(work, &REDIS_JS)?;
    let pkg = dir.join("packages/redis");
    if !pkg.join("node_modules/uncrypto").exists() {
        // Its one runtime dependency (the tests need nothing else: bun runs TypeScript itself).
        eprintln!("xtask: bun install (packages/redis, runtime dependencies only)");
        run(Command::new(&bun).args(["install", "--production", "--no-save"]).current_dir(&pkg))?;
    }
    Ok((dir, bun))
}

/// The redis-py checkout, and a venv's python with pytest and the client's dependencies.
fn prepare_py(work: &Path) -> Result<(PathBuf, PathBuf), String> {
    let venv = work.join("venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        if !have("python3") {
            setup::apt_install(&["python3", "python3-venv"])?;
        }
        let mut make = Command::new("python3");
        make.args(["-m", "venv"]).arg(&venv);
        if run(&mut make).is_err() {
            setup::apt_install(&["python3-venv"])?;
            let _ = std::fs::remove_dir_all(&venv);
            run(&mut make)?;
        }
    }
    let stamp = venv.join("compat-requirements.txt");
    let wanted = PY_REQUIREMENTS.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        eprintln!("xtask: pip install {}", PY_REQUIREMENTS.join(" "));
        run(Command::new(&python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(PY_REQUIREMENTS))?;
        std::fs::write(&stamp, &wanted).map_err(|e| e.to_string())?;
    }
    Ok((checkout(work, &REDIS_PY)?, python))
}

// ---------------------------------------------------------------------------------------------
// Running.

#[derive(Debug)]
struct Outcome {
    cases: Vec<Case>,
    status: String,
    log: PathBuf,
    /// For each entry with a probe: what redis-cli answered, and whether it showed `expect`.
    probes: Vec<(usize, String, bool)>,
}

/// Starts a fresh redis-server and redcount-rest, runs the command `make` builds (given the
/// JUnit file to write) with the client's environment, reads the JUnit file, and runs the
/// entries' probes on the same Redis (the evidence that it lacks what they say).
fn run_suite(
    dir: &Path,
    bins: &Path,
    entries: &[Entry],
    naming: Naming,
    make: impl FnOnce(&Path) -> Command,
) -> Result<Outcome, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (_redis, redis_port) = procs::redis_server(&dir.join("redis"))?;
    let token = procs::secret()?;
    let front_log = std::fs::File::create(dir.join("front.log")).map_err(|e| e.to_string())?;
    let port = procs::free_port();
    let level = std::env::var("REDCOUNT_COMPAT_FRONT_LOG").unwrap_or_else(|_| "info".into());
    let mut cmd = redcount_procs::rest_front_command(
        bins,
        port,
        &format!("redis://127.0.0.1:{redis_port}"),
        &["--threads", "1", "--log", &level],
    );
    cmd.env("REDCOUNT_REST_TOKEN", &token).stdout(front_log.try_clone().map_err(|e| e.to_string())?).stderr(front_log);
    let mut front = Guard::spawn("redcount-rest", &mut cmd)?;
    procs::wait_port(port, Duration::from_secs(10), &mut front)?;

    let junit = dir.join("junit.xml");
    let log = dir.join("suite.log");
    let env = [
        ("UPSTASH_REDIS_REST_URL", format!("http://127.0.0.1:{port}")),
        ("UPSTASH_REDIS_REST_TOKEN", token),
        ("UPSTASH_DISABLE_TELEMETRY", "1".into()),
        ("NO_COLOR", "1".into()),
    ];
    let mut cmd = make(&junit);
    cmd.envs(env);
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(out.try_clone().map_err(|e| e.to_string())?).stderr(out);
    eprintln!("xtask: running {:?} (output: {})", cmd.get_program(), log.display());
    let start = Instant::now();
    let mut child = Guard::spawn("test suite", &mut cmd)?;
    let mut status = String::from("finished");
    while child.alive() {
        if start.elapsed() > SUITE_TIMEOUT {
            status = format!("stopped after {SUITE_TIMEOUT:?}");
            child.stop(Duration::from_secs(5));
            break;
        }
        if !front.alive() {
            status = "redcount-rest exited during the run".into();
            child.stop(Duration::from_secs(5));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("xtask: suite {status} in {:.0?}", start.elapsed());
    let xml = std::fs::read_to_string(&junit)
        .map_err(|e| format!("{} (the suite wrote no JUnit report; see {}): {e}", junit.display(), log.display()))?;
    let mut probes = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some((probe, expect)) = &e.probe {
            // Commands separated by ` ; ` run in turn; the last one's answer is the evidence.
            // --no-raw: an error reads `(error) ERR …`, a missing command's COMMAND INFO `1) (nil)`.
            let mut text = String::new();
            for step in probe.split(" ; ") {
                let out = Command::new("redis-cli")
                    .args(["--no-raw", "-p", &redis_port.to_string()])
                    .args(step.split_whitespace())
                    .output()
                    .map_err(|e| format!("cannot run redis-cli: {e}"))?;
                text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            }
            let holds = text.contains(expect.as_str());
            probes.push((i, text, holds));
        }
    }
    Ok(Outcome { cases: parse_junit(&xml, naming), status, log, probes })
}

// ---------------------------------------------------------------------------------------------
// JUnit reports (bun's and pytest's): just enough XML.

#[derive(Debug)]
struct Case {
    id: String,
    result: CaseResult,
}

#[derive(Debug, PartialEq)]
enum CaseResult {
    Passed,
    Skipped,
    Failed(String),
}

/// How a suite's JUnit report names a test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Naming {
    /// bun: the enclosing `<testsuite>`s (the file, then describe blocks), then the name,
    /// joined with ` > `.
    Suites,
    /// pytest: `classname::name` (`tests.commands.x.test_y::test_z[param]`).
    Classname,
}

/// Every `<testcase>` of a JUnit report, named as `naming` says.
fn parse_junit(xml: &str, naming: Naming) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut suites: Vec<String> = Vec::new();
    let mut rest = xml;
    while let Some(lt) = rest.find('<') {
        rest = &rest[lt..];
        let Some(gt) = rest.find('>') else { break };
        let tag = &rest[1..gt];
        let after = &rest[gt + 1..];
        let self_closing = tag.ends_with('/');
        let name = tag.trim_end_matches('/').split_whitespace().next().unwrap_or("");
        match name {
            "testsuite" if !self_closing => suites.push(attr(tag, "name").unwrap_or_default()),
            "/testsuite" => {
                suites.pop();
            }
            "testcase" => {
                let case_name = attr(tag, "name").unwrap_or_default();
                let class = attr(tag, "classname").unwrap_or_default();
                let id = match naming {
                    Naming::Classname => format!("{class}::{case_name}"),
                    Naming::Suites => {
                        // bun's outermost <testsuite> is the whole run ("bun test"), unnamed or not.
                        let mut parts: Vec<String> =
                            suites.iter().filter(|s| !s.is_empty() && *s != "bun test").cloned().collect();
                        parts.push(case_name);
                        parts.join(" > ")
                    }
                };
                let (body, next) = if self_closing {
                    ("", after)
                } else {
                    match after.find("</testcase>") {
                        Some(end) => (&after[..end], &after[end + "</testcase>".len()..]),
                        None => (after, ""),
                    }
                };
                let result = if let Some(p) = body.find("<failure").or_else(|| body.find("<error")) {
                    let el = &body[p..];
                    let open_end = el.find('>').unwrap_or(el.len());
                    let message = attr(&el[..open_end], "message").unwrap_or_default();
                    let text_end = el.find("</failure>").or_else(|| el.find("</error>")).unwrap_or(el.len());
                    let text = unescape(el.get(open_end + 1..text_end).unwrap_or(""));
                    CaseResult::Failed(if message.trim().is_empty() { text } else { format!("{message}\n{text}") })
                } else if body.contains("<skipped") {
                    CaseResult::Skipped
                } else {
                    CaseResult::Passed
                };
                cases.push(Case { id, result });
                rest = next;
                continue;
            }
            _ => {}
        }
        rest = after;
    }
    cases
}

/// The value of attribute `key` in a tag's text, unescaped.
fn attr(tag: &str, key: &str) -> Option<String> {
    let mut from = 0;
    while let Some(p) = tag[from..].find(key) {
        let at = from + p;
        let before_ok = at == 0 || tag.as_bytes()[at - 1].is_ascii_whitespace();
        let rest = &tag[at + key.len()..];
        if before_ok && rest.starts_with("=\"") {
            let value = &rest[2..];
            return value.find('"').map(|end| unescape(&value[..end]));
        }
        from = at + key.len();
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';').filter(|&i| i < 12) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..semi];
        let ch = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Known classifications: tests/compat/expected.toml.

/// The classes a failure may have.
const CLASSES: [&str; 3] = ["redis-lacks", "upstash-only", "front-differs"];

#[derive(Debug)]
struct Entry {
    pattern: String,
    class: String,
    reason: String,
    /// redis-cli commands (whitespace-separated arguments; several separated by ` ; `) and what
    /// the last one's `--no-raw` answer from the suite's Redis must contain for the
    /// classification to hold.
    probe: Option<(String, String)>,
}

/// `[js]` and `[py]` tables of `"test id or glob" = { class = "…", reason = "…" }` (optionally
/// with `probe = "…", expect = "…"`): a TOML subset (one entry a line), read without a TOML
/// crate to keep the xtask std-only.
#[derive(Debug, Default)]
struct Expected {
    suites: BTreeMap<String, Vec<Entry>>,
}

impl Expected {
    fn load(path: &Path) -> Result<Expected, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut expected = Expected::default();
        let mut section: Option<String> = None;
        for (n, line) in text.lines().enumerate() {
            let err = |what: &str| format!("{}:{}: {what}", path.display(), n + 1);
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(name.trim().to_string());
                continue;
            }
            let suite = section.clone().ok_or_else(|| err("an entry before any [js] or [py] table"))?;
            let (pattern, rest) = toml_string(line).ok_or_else(|| err("expected a quoted test name"))?;
            let rest = rest.trim_start().strip_prefix('=').ok_or_else(|| err("expected `=`"))?.trim();
            let inner = rest
                .strip_prefix('{')
                .and_then(|r| r.trim_end().strip_suffix('}'))
                .ok_or_else(|| err("expected { class = \"…\", reason = \"…\" } on one line"))?;
            let mut fields = BTreeMap::new();
            let mut rest = inner.trim();
            while !rest.is_empty() {
                let eq = rest.find('=').ok_or_else(|| err("expected key = \"value\""))?;
                let key = rest[..eq].trim().to_string();
                let (value, after) =
                    toml_string(rest[eq + 1..].trim_start()).ok_or_else(|| err("expected a string"))?;
                fields.insert(key, value);
                rest = after.trim_start().strip_prefix(',').unwrap_or(after).trim_start();
            }
            let class = fields.remove("class").ok_or_else(|| err("missing class"))?;
            if !CLASSES.contains(&class.as_str()) {
                return Err(err(&format!("class `{class}` is not one of {CLASSES:?}")));
            }
            let reason = fields.remove("reason").ok_or_else(|| err("missing reason"))?;
            let probe = match (fields.remove("probe"), fields.remove("expect")) {
                (Some(p), Some(e)) => Some((p, e)),
                (None, None) => None,
                _ => return Err(err("probe and expect go together")),
            };
            if let Some(k) = fields.keys().next() {
                return Err(err(&format!("unknown field `{k}`")));
            }
            expected.suites.entry(suite).or_default().push(Entry { pattern, class, reason, probe });
        }
        Ok(expected)
    }

    fn entries(&self, suite: &str) -> &[Entry] {
        self.suites.get(suite).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The index of the first entry naming `id` exactly, else of the first glob matching it.
    fn classify(&self, suite: &str, id: &str) -> Option<usize> {
        let entries = self.entries(suite);
        entries.iter().position(|e| e.pattern == id).or_else(|| entries.iter().position(|e| glob(&e.pattern, id)))
    }
}

/// A TOML basic string at the start of `s` (`\"`, `\\`, `\n`, `\t` escapes), and what follows.
fn toml_string(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 2..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// `*` matches any run of characters (also none); everything else matches itself.
fn glob(pattern: &str, text: &str) -> bool {
    if !pattern.contains('*') {
        return pattern == text;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(p) => rest = &rest[p + part.len()..],
            None => return false,
        }
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The summary.

#[derive(Debug)]
struct Failure {
    id: String,
    message: String,
    /// The entry that classifies it: class, reason, pattern.
    class: Option<(String, String, String)>,
}

#[derive(Debug)]
struct Report {
    suite: &'static str,
    version: String,
    status: String,
    log: PathBuf,
    passed: usize,
    skipped: usize,
    failed: Vec<Failure>,
    /// Exact (non-glob) entries whose test passed: the front or Redis caught up.
    now_passing: Vec<String>,
    /// Entries no failure matched (stale, or their tests were renamed).
    unused: Vec<String>,
    /// Entries whose probe no longer shows what they claim: (pattern, probe, answer).
    evidence_lost: Vec<(String, String, String)>,
}

impl Report {
    fn new(suite: &'static str, src: &Source, outcome: Outcome, expected: &Expected) -> Report {
        let mut r = Report {
            suite,
            version: format!("{} at {}", src.version, &src.commit[..12]),
            status: outcome.status,
            log: outcome.log,
            passed: 0,
            skipped: 0,
            failed: Vec::new(),
            now_passing: Vec::new(),
            unused: Vec::new(),
            evidence_lost: Vec::new(),
        };
        let entries = expected.entries(suite);
        let mut used = vec![false; entries.len()];
        for case in outcome.cases {
            match case.result {
                CaseResult::Passed => {
                    r.passed += 1;
                    if entries.iter().any(|e| e.pattern == case.id) {
                        r.now_passing.push(case.id);
                    }
                }
                CaseResult::Skipped => r.skipped += 1,
                CaseResult::Failed(message) => {
                    let class = expected.classify(suite, &case.id).map(|i| {
                        used[i] = true;
                        (entries[i].class.clone(), entries[i].reason.clone(), entries[i].pattern.clone())
                    });
                    r.failed.push(Failure { id: case.id, message, class });
                }
            }
        }
        r.unused = entries.iter().zip(&used).filter(|(_, u)| !**u).map(|(e, _)| e.pattern.clone()).collect();
        for (i, answer, holds) in outcome.probes {
            if !holds && used[i] {
                let probe = entries[i].probe.as_ref().map(|(p, _)| p.clone()).unwrap_or_default();
                r.evidence_lost.push((entries[i].pattern.clone(), probe, answer));
            }
        }
        r
    }

    fn count(&self, class: &str) -> usize {
        self.failed.iter().filter(|f| f.class.as_ref().is_some_and(|(c, _, _)| c == class)).count()
    }

    fn unclassified(&self) -> usize {
        self.failed.iter().filter(|f| f.class.is_none()).count()
    }

    /// Tab-separated: suite, test, class (or `unclassified`), the entry's pattern.
    fn write_tsv(&self, out: &mut String) {
        for f in &self.failed {
            let (class, pattern) =
                f.class.as_ref().map(|(c, _, p)| (c.as_str(), p.as_str())).unwrap_or(("unclassified", ""));
            out.push_str(&format!("{}\t{}\t{class}\t{pattern}\n", self.suite, f.id));
        }
    }

    fn write(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "\n== {} ({}): {} passed, {} failed, {} skipped; run {} (log {})",
            self.suite,
            self.version,
            self.passed,
            self.failed.len(),
            self.skipped,
            self.status,
            self.log.display()
        );
        for class in CLASSES {
            // One line per entry: the test itself, or the glob and how many tests it matched.
            let mut groups: Vec<(&str, &str, Vec<&str>)> = Vec::new();
            for f in &self.failed {
                let Some((c, reason, pattern)) = &f.class else { continue };
                if c != class {
                    continue;
                }
                match groups.iter_mut().find(|g| g.0 == pattern) {
                    Some(g) => g.2.push(&f.id),
                    None => groups.push((pattern, reason, vec![&f.id])),
                }
            }
            let _ = writeln!(out, "  {class}: {}", groups.iter().map(|g| g.2.len()).sum::<usize>());
            for (pattern, reason, ids) in groups {
                if ids.len() == 1 && ids[0] == pattern {
                    let _ = writeln!(out, "    {pattern}\n      {reason}");
                } else {
                    let _ = writeln!(out, "    {pattern} ({} tests)\n      {reason}", ids.len());
                }
            }
        }
        let _ = writeln!(out, "  UNCLASSIFIED: {}", self.unclassified());
        for f in self.failed.iter().filter(|f| f.class.is_none()) {
            let first: Vec<&str> = f.message.lines().filter(|l| !l.trim().is_empty()).take(4).collect();
            let _ = writeln!(out, "    {}", f.id);
            for l in first {
                let l: String = l.trim().chars().take(200).collect();
                let _ = writeln!(out, "      | {l}");
            }
        }
        if !self.evidence_lost.is_empty() {
            let _ = writeln!(out, "  EVIDENCE LOST (the probe no longer shows what the entry claims; reclassify):");
            for (pattern, probe, answer) in &self.evidence_lost {
                let _ = writeln!(out, "    {pattern}\n      redis-cli {probe} -> {}", answer.replace('\n', " "));
            }
        }
        if !self.unused.is_empty() {
            let _ = writeln!(out, "  entries that matched no failure (stale, or a test that passes on some runs):");
            for p in &self.unused {
                let _ = writeln!(out, "    {p}");
            }
        }
        if !self.now_passing.is_empty() {
            let _ = writeln!(out, "  now passing (remove from tests/compat/expected.toml):");
            for id in &self.now_passing {
                let _ = writeln!(out, "    {id}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("a*", "abc"));
        assert!(glob("*c", "abc"));
        assert!(glob("a*c", "ac"));
        assert!(glob("pkg/commands/json_*.test.ts > *", "pkg/commands/json_get.test.ts > JSON > works"));
        assert!(!glob("a*b*c", "acb"));
        assert!(glob("x", "x") && !glob("x", "xy"));
    }

    #[test]
    fn junit_of_bun_and_pytest() {
        let bun = r#"<testsuites name="bun test"><testsuite name="pkg/a.test.ts" tests="2"><testsuite name="outer"><testcase name="ok" classname="outer" /><testsuite name="A.b"><testcase name="c" classname="A.b" /></testsuite><testcase name="bad &amp; sad" classname="outer"><failure message="boom" type="AssertionError">line</failure></testcase></testsuite><testcase name="top" classname="pkg/a.test.ts"><skipped /></testcase></testsuite></testsuites>"#;
        let cases = parse_junit(bun, Naming::Suites);
        let ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "pkg/a.test.ts > outer > ok",
                "pkg/a.test.ts > outer > A.b > c",
                "pkg/a.test.ts > outer > bad & sad",
                "pkg/a.test.ts > top"
            ]
        );
        assert_eq!(cases[2].result, CaseResult::Failed("boom\nline".into()));
        assert_eq!(cases[3].result, CaseResult::Skipped);
        let py = r#"<testsuites><testsuite name="pytest"><testcase classname="tests.commands.test_x" name="test_y[1]" time="0.1"><error message="setup">E</error></testcase><testcase classname="tests.test_z" name="test_w" /></testsuite></testsuites>"#;
        let cases = parse_junit(py, Naming::Classname);
        assert_eq!(cases[0].id, "tests.commands.test_x::test_y[1]");
        assert!(matches!(cases[0].result, CaseResult::Failed(_)));
        assert_eq!(cases[1].id, "tests.test_z::test_w");
        assert_eq!(cases[1].result, CaseResult::Passed);
    }

    #[test]
    fn toml_subset() {
        assert_eq!(toml_string(r#""a\"b" = 1"#), Some(("a\"b".into(), " = 1")));
    }
}
