//! `cargo xtask tidy`: what the documents and the code say twice must agree.
//!
//! - every test (or module, or function) a document names as `module::name` exists;
//! - no bound is written as a number in `lua/`: the scripts name the Rust constant
//!   (`RUST.quota.MAX_LIMIT`), which redcount-core's build replaces by its value;
//! - no benchmark figure outside BENCHMARKS.md;
//! - one `compatibility_date`, in wrangler.toml;
//! - no history in code comments (issue numbers, "found by", passes, dates, commit hashes):
//!   that belongs to git and RELIABILITY.md;
//! - README.md stays short (at most [`README_LINES`] lines) and its links lead somewhere;
//! - no error told apart by a part of its text (`e.to_string().contains(…)` and the like, see
//!   [`TEXT_MATCHES`]): by its code, its kind or a field, or a whole message compared;
//! - no function in the front longer than [`FRONT_FN_LINES`] lines.
//!
//! `cargo xtask test` runs it first, and checks at its end that the run left the tree as it
//! found it.

use crate::setup::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// README.md's length limit: what it is, the quick start, a tour and links; the rest is in docs/.
pub const README_LINES: usize = 200;

/// The most lines a function of the front (crates/redcount-front/src) may take, its
/// signature and closing brace included: a longer one does more than one thing.
pub const FRONT_FN_LINES: usize = 80;

/// Ways of matching an error by a part of its text (its `Display`, its message or detail).
/// A rule that depends on English breaks when the words change; a test that does asserts
/// less than the code, kind or field it stands for. Compare those, or a whole message.
const TEXT_MATCHES: &[&str] = &[
    "to_string().contains(",
    "to_string().starts_with(",
    "to_string().ends_with(",
    "to_string() ==",
    "to_string() !=",
    "}\").contains(",
    "}\").starts_with(",
    "message.contains(",
    "message.starts_with(",
    "detail().contains(",
    "details().contains(",
    "unwrap_err().contains(",
    "unwrap_err().starts_with(",
];

/// Runs every check and reports every problem found, not just the first.
pub fn tidy() -> Result<(), String> {
    let root = root();
    let files = tracked_files(&root)?;
    let mut problems = Vec::new();
    let docs: Vec<&PathBuf> = files.iter().filter(|f| is_doc(f)).collect();
    let sources: Vec<&PathBuf> = files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")).collect();
    let items = Items::of(&root, &sources);
    for doc in &docs {
        let text = read(&root, doc);
        cited_names(doc, &text, &items, &mut problems);
        links(&root, doc, &text, &files, &mut problems);
        if !doc.ends_with("BENCHMARKS.md") && !doc.ends_with("RELIABILITY.md") && !doc.ends_with("CHANGELOG.md") {
            benchmark_figures(doc, &text, &mut problems);
        }
    }
    for f in files.iter().filter(|f| f.starts_with("lua") && f.extension().is_some_and(|e| e == "lua")) {
        lua_numbers(f, &read(&root, f), &mut problems);
    }
    compatibility_dates(&root, &files, &mut problems);
    for f in files.iter().filter(|f| has_code_comments(f)) {
        history_in_comments(f, &read(&root, f), &mut problems);
    }
    for f in sources.iter().filter(|f| !f.ends_with("xtask/src/tidy.rs")) {
        let text = read(&root, f);
        error_text_matches(f, &text, &mut problems);
        if f.starts_with("crates/redcount-front/src") {
            long_functions(f, &text, FRONT_FN_LINES, &mut problems);
        }
    }
    let readme = read(&root, Path::new("README.md")).lines().count();
    if readme > README_LINES {
        problems.push(format!("README.md: {readme} lines, at most {README_LINES} (move detail into docs/)"));
    }
    if problems.is_empty() {
        eprintln!("xtask tidy: {} documents, {} sources, {} files checked", docs.len(), sources.len(), files.len());
        Ok(())
    } else {
        Err(format!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  ")))
    }
}

/// `git status --porcelain`, to compare the tree before and after a run.
pub fn status() -> Result<String, String> {
    let out = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The files git knows (committed or added), and new ones it does not ignore.
fn tracked_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run git ls-files: {e}"))?;
    if !out.status.success() {
        return Err("git ls-files failed: tidy needs the repository".into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).filter(|p| root.join(p).is_file()).collect())
}

fn read(root: &Path, file: &Path) -> String {
    std::fs::read_to_string(root.join(file)).unwrap_or_default()
}

fn is_doc(f: &Path) -> bool {
    f.extension().is_some_and(|e| e == "md") && (f.parent() == Some(Path::new("")) || f.starts_with("docs"))
}

fn has_code_comments(f: &Path) -> bool {
    let code =
        f.extension().is_some_and(|e| ["rs", "js", "mjs", "lua", "toml", "sh"].contains(&e.to_str().unwrap_or("")));
    // This file names what it looks for.
    code && !f.ends_with("xtask/src/tidy.rs") && !f.ends_with("Cargo.lock")
}

/// What the workspace's Rust sources define, by the module (file stem, directory, inline
/// `mod`, or crate) it is defined in.
struct Items {
    by_module: BTreeMap<String, BTreeSet<String>>,
}

impl Items {
    fn of(root: &Path, sources: &[&PathBuf]) -> Items {
        let mut by_module: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for f in sources {
            let text = read(root, f);
            let mut modules = module_names(f);
            let words = words(&text);
            let mut defined = BTreeSet::new();
            // Rows of a table of tests (`name => row,`), which a macro makes functions of.
            for line in text.lines() {
                if let Some((name, _)) = line.trim_start().split_once(" =>")
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                {
                    defined.insert(name.to_string());
                }
            }
            for pair in words.windows(2) {
                if ["fn", "mod", "struct", "enum", "trait", "type", "const", "static"].contains(&pair[0]) {
                    defined.insert(pair[1].to_string());
                    if pair[0] == "mod" {
                        // An inline module: its items are counted as its file's too.
                        modules.push(pair[1].to_string());
                    }
                }
            }
            for m in modules {
                by_module.entry(m).or_default().extend(defined.iter().cloned());
            }
        }
        Items { by_module }
    }

    /// Whether `parent::child` names something: `child` may end in `*`.
    fn has(&self, parent: &str, child: &str) -> bool {
        let Some(defined) = self.by_module.get(parent) else { return false };
        match child.split_once('*') {
            Some((prefix, suffix)) => defined.iter().any(|d| d.starts_with(prefix) && d.ends_with(suffix)),
            None => defined.contains(child),
        }
    }
}

/// The names a file's items are reached by: its stem (its directory for mod.rs, lib.rs and
/// main.rs: the crate, underscored).
fn module_names(f: &Path) -> Vec<String> {
    let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
    let mut names = vec![stem.clone()];
    if ["mod", "lib", "main"].contains(&stem.as_str()) {
        let mut dirs = f.parent().into_iter().flat_map(Path::ancestors);
        let dir = dirs.find(|d| !d.ends_with("src")).and_then(|d| d.file_name()).and_then(|d| d.to_str());
        if let Some(d) = dir {
            names.push(d.replace('-', "_"));
        }
    }
    names
}

fn words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect()
}

/// Every `a::b::c` (lower case, in backticks) names something the workspace defines: each
/// name inside the one before it. Braces expand (`name{,_twice}`), `*` stands for any text.
/// The official clients' own test files (pytest's `test_*`, COMPAT.md) are theirs.
fn cited_names(doc: &Path, text: &str, items: &Items, problems: &mut Vec<String>) {
    for (line_no, line) in text.lines().enumerate() {
        for span in line.split('`').skip(1).step_by(2) {
            let cited = span.trim_end_matches("()");
            let is_path = cited.contains("::")
                && cited.split("::").all(|s| {
                    !s.is_empty()
                        && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_{},*".contains(c))
                });
            let first = cited.split("::").next().unwrap_or("");
            if !is_path || EXTERNAL.contains(&first) || first.starts_with("test_") {
                continue;
            }
            for path in expand_braces(cited) {
                let segments: Vec<&str> = path.split("::").collect();
                if let Some(pair) = segments.windows(2).find(|p| !items.has(p[0], p[1])) {
                    problems.push(format!(
                        "{}:{}: `{cited}` names nothing: no `{}` in `{}`",
                        doc.display(),
                        line_no + 1,
                        pair[1],
                        pair[0]
                    ));
                    break;
                }
            }
        }
    }
}

/// Crates a document may name paths of that are not the workspace's.
const EXTERNAL: &[&str] = &["std", "core", "alloc", "tokio", "redis", "serde", "serde_json", "axum", "hyper", "clap"];

fn expand_braces(s: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else { return vec![s.to_string()] };
    if close < open {
        return vec![s.to_string()];
    }
    s[open + 1..close]
        .split(',')
        .flat_map(|choice| expand_braces(&format!("{}{choice}{}", &s[..open], &s[close + 1..])))
        .collect()
}

/// Relative links (`[text](path)`, `(path#anchor)`) lead to a file or directory of the tree.
fn links(root: &Path, doc: &Path, text: &str, files: &[PathBuf], problems: &mut Vec<String>) {
    for (line_no, line) in text.lines().enumerate() {
        for part in line.split("](").skip(1) {
            let Some(target) = part.split(')').next() else { continue };
            let target = target.split('#').next().unwrap_or("").trim();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let path = doc.parent().unwrap_or(Path::new("")).join(target);
            let normal = normalize(&path);
            let exists = root.join(&normal).exists() || files.iter().any(|f| f.starts_with(&normal));
            if !exists {
                problems.push(format!("{}:{}: link to `{target}`, which does not exist", doc.display(), line_no + 1));
            }
        }
    }
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A measured speed or ratio: a number with a unit of time per call or calls per time, or
/// a "×" ratio. They live in BENCHMARKS.md, which is regenerated; elsewhere they go stale.
fn benchmark_figures(doc: &Path, text: &str, problems: &mut Vec<String>) {
    const UNITS: &[&str] = &["µs", "ns", "req/s", "ops/s", "calls/s", "requests/s", "rps", "×"];
    let mut in_code = false;
    for (line_no, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        for unit in UNITS {
            for (at, _) in line.match_indices(unit) {
                // A ratio is written against its number (1.9×); `4.5 × 10^12` is arithmetic.
                let before = if *unit == "×" { &line[..at] } else { line[..at].trim_end() };
                if before.ends_with(|c: char| c.is_ascii_digit()) {
                    problems.push(format!(
                        "{}:{}: a benchmark figure (`…{}{unit}`) outside BENCHMARKS.md: link to it instead",
                        doc.display(),
                        line_no + 1,
                        &before[before.len().saturating_sub(8)..]
                    ));
                }
            }
        }
    }
}

/// No number of five digits or more in a script's code, but a unit factor (`* 1000000`):
/// a bound is written `RUST.module.NAME`, so it is the Rust constant's value.
fn lua_numbers(f: &Path, text: &str, problems: &mut Vec<String>) {
    for (line_no, line) in text.lines().enumerate() {
        let code = line.split("--").next().unwrap_or("");
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i].is_ascii_digit() && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
            {
                let end = (i..bytes.len()).find(|&j| !bytes[j].is_ascii_digit()).unwrap_or(bytes.len());
                let factor = code[..i].trim_end().ends_with('*');
                if end - i >= 5 && !factor {
                    problems.push(format!(
                        "{}:{}: `{}` written as a number: name the Rust constant (`RUST.module.NAME`)",
                        f.display(),
                        line_no + 1,
                        &code[i..end]
                    ));
                }
                i = end;
            } else {
                i += 1;
            }
        }
    }
}

/// Every `compatibility_date` written in the tree is wrangler.toml's, and only wrangler.toml
/// files (the worker's, an example's) write one: code that makes a configuration reads it.
fn compatibility_dates(root: &Path, files: &[PathBuf], problems: &mut Vec<String>) {
    let key = "compatibility_date";
    let date_of = |line: &str| -> Option<String> {
        let after = &line[line.find(key)? + key.len()..];
        let start = after.find(|c: char| c.is_ascii_digit())?;
        let date: String = after[start..].chars().take(10).collect();
        let b = date.as_bytes();
        (b.len() == 10 && b[4] == b'-' && b[7] == b'-').then_some(date)
    };
    let wrangler = read(root, Path::new("wrangler.toml"));
    let Some(the_date) = wrangler.lines().find_map(date_of) else {
        problems.push("wrangler.toml: no compatibility_date".into());
        return;
    };
    for f in files.iter().filter(|f| !f.ends_with("xtask/src/tidy.rs")) {
        for (line_no, line) in read(root, f).lines().enumerate() {
            if let Some(date) = date_of(line)
                && (date != the_date || (!f.ends_with("wrangler.toml") && !in_test_module(root, f, line_no)))
            {
                problems.push(format!(
                    "{}:{}: compatibility_date {date}: wrangler.toml's ({the_date}) is the one; read it from there",
                    f.display(),
                    line_no + 1
                ));
            }
        }
    }
}

/// Whether line `line_no` of a Rust file is inside its `#[cfg(test)]` module (a parser's
/// unit tests may write a configuration of their own).
fn in_test_module(root: &Path, f: &Path, line_no: usize) -> bool {
    let text = read(root, f);
    text.lines().take(line_no).any(|l| l.trim() == "#[cfg(test)]")
}

/// Comments say why, not when or who: no issue numbers, passes, "found by", dates or commit
/// hashes in a comment.
fn history_in_comments(f: &Path, text: &str, problems: &mut Vec<String>) {
    let marker = match f.extension().and_then(|e| e.to_str()) {
        Some("lua") => "--",
        Some("toml" | "sh") => "#",
        _ => "//",
    };
    for (line_no, line) in text.lines().enumerate() {
        let Some(at) = line.find(marker) else { continue };
        // A `//` inside a string (a URL) is not a comment.
        if line[..at].matches('"').count() % 2 == 1 {
            continue;
        }
        let comment = &line[at + marker.len()..];
        if let Some(why) = history(comment) {
            problems.push(format!("{}:{}: history in a comment ({why}): {}", f.display(), line_no + 1, comment.trim()));
        }
    }
}

/// Every line that matches an error by a part of its text ([`TEXT_MATCHES`]).
fn error_text_matches(f: &Path, text: &str, problems: &mut Vec<String>) {
    for (line_no, line) in text.lines().enumerate() {
        if let Some(how) = TEXT_MATCHES.iter().find(|m| line.contains(*m)) {
            problems.push(format!(
                "{}:{}: `{how}` tells an error by its text: compare its code, kind or a field (or the whole message)",
                f.display(),
                line_no + 1
            ));
        }
    }
}

/// Every function longer than `limit` lines, from its `fn` line to its closing brace (as
/// rustfmt lays them out: the brace alone at the `fn`'s indent).
fn long_functions(f: &Path, text: &str, limit: usize, problems: &mut Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let Some(name) = fn_name(code) else { continue };
        let indent = &line[..line.len() - code.len()];
        // A declaration without a body (a trait's) and a function on one line end there.
        let Some(open) = lines[i..].iter().position(|l| l.contains('{') || l.trim_end().ends_with(';')) else {
            continue;
        };
        let opening = lines[i + open].trim_end();
        if !opening.contains('{') || opening.ends_with('}') {
            continue;
        }
        let closing = format!("{indent}}}");
        let Some(end) = lines[i + 1..].iter().position(|l| l.trim_end() == closing) else { continue };
        let n = end + 2;
        if n > limit {
            problems.push(format!("{}:{}: fn {name} is {n} lines, at most {limit}: split it", f.display(), i + 1));
        }
    }
}

/// The name of the function a line of code declares, if it declares one.
fn fn_name(code: &str) -> Option<&str> {
    let mut rest = code;
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// What in a comment is history, if anything.
fn history(comment: &str) -> Option<&'static str> {
    let lower = comment.to_lowercase();
    let w = words(&lower);
    for pair in w.windows(2) {
        if pair[0] == "issue" && pair[1].chars().all(|c| c.is_ascii_digit()) {
            return Some("an issue number");
        }
    }
    let found_by = lower
        .split("found by")
        .nth(1)
        .is_some_and(|rest| ["pass", "test", "fuzz", "review", "attacker"].iter().any(|who| rest.contains(who)));
    if found_by || lower.contains("attacker's pass") || lower.contains("attacker pass") {
        return Some("who found it");
    }
    for ordinal in ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"] {
        if lower.contains(&format!("{ordinal} pass")) {
            return Some("a pass");
        }
    }
    let b = comment.as_bytes();
    for i in 0..b.len().saturating_sub(9) {
        let d = |j: usize| b[i + j].is_ascii_digit();
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        // A day of this project's life (not 2001-09-09, a window's end; not an example
        // timestamp, 2026-11-23T21:00:00Z).
        let recent = b[i] == b'2' && b[i + 1] == b'0' && b[i + 2] >= b'2' && b[i + 2] != b'9';
        let timestamp = b.get(i + 10) == Some(&b'T');
        if boundary
            && recent
            && d(3)
            && b[i + 4] == b'-'
            && d(5)
            && d(6)
            && b[i + 7] == b'-'
            && d(8)
            && d(9)
            && !timestamp
        {
            return Some("a date");
        }
    }
    for word in comment.split(|c: char| !c.is_ascii_alphanumeric()) {
        let hex =
            (7..=12).contains(&word.len()) && word.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
        if hex && word.chars().any(|c| c.is_ascii_digit()) && word.chars().any(|c| c.is_ascii_alphabetic()) {
            return Some("a commit hash");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_to_each_choice() {
        assert_eq!(expand_braces("m::a{,_b}"), ["m::a", "m::a_b"]);
        assert_eq!(expand_braces("m::x"), ["m::x"]);
    }

    #[test]
    fn history_is_told_apart_from_why() {
        assert_eq!(history(" see issue 12 for why"), Some("an issue number"));
        assert_eq!(history(" found by the fifth pass"), Some("who found it"));
        assert_eq!(history(" measured on 2026-11-24"), Some("a date"));
        assert_eq!(history(" as in 746dd75"), Some("a commit hash"));
        assert_eq!(history(" the issuer's 2 keys, cafe in hex, 1000000 µs a second"), None);
        assert_eq!(history(" the routes are found by asking the router; 9007199254740991e0"), None);
        assert_eq!(history(" a window ends 2001-09-09; a log line: 2026-11-23T21:00:00Z"), None);
    }

    #[test]
    fn a_bound_written_as_a_number_is_found() {
        let mut problems = Vec::new();
        lua_numbers(
            Path::new("lua/x.lua"),
            "local a = int('a', ARGV[1], 1, 1000000000)\nlocal t = s * 1000000 -- 10000000",
            &mut problems,
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("1000000000"));
    }

    #[test]
    fn an_error_told_by_its_text_is_found() {
        let mut problems = Vec::new();
        let text = [
            r#"assert!(e.to_string().contains("id is in use"), "{e}");"#,
            r#"if format!("{err}").contains("NOPERM") {"#,
            r#"assert!(r.message.starts_with("CROSSSLOT"));"#,
            r#"assert_eq!(r.kind, ErrorKind::Conflict);"#,
            r#"assert_eq!(error_code(&v), Some("NOPERM"));"#,
            r#"assert!(!mentions(&v, "secret"));"#,
        ];
        error_text_matches(Path::new("x.rs"), &text.join("\n"), &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems.iter().zip(["x.rs:1:", "x.rs:2:", "x.rs:3:"]).all(|(p, at)| p.starts_with(at)),
            "{problems:?}"
        );
    }

    #[test]
    fn a_long_function_is_found() {
        let body = |n: usize| "        let _ = 1;\n".repeat(n);
        let text = format!(
            "impl A {{\n    fn short(&self) -> u8 {{ 1 }}\n    pub(crate) async fn long(\n        &self,\n    ) {{\n{}    }}\n    fn fits() {{\n{}    }}\n}}\ntrait T {{\n    fn declared(&self);\n}}\n",
            body(8),
            body(6)
        );
        let mut problems = Vec::new();
        long_functions(Path::new("x.rs"), &text, 8, &mut problems);
        assert_eq!(problems, ["x.rs:3: fn long is 12 lines, at most 8: split it"]);
    }

    #[test]
    fn a_figure_outside_the_benchmarks_is_found() {
        let mut problems = Vec::new();
        benchmark_figures(
            Path::new("README.md"),
            "takes 27 µs\n1.9× faster\n```\n5 µs\n```\nat most 4.5 × 10^12",
            &mut problems,
        );
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
