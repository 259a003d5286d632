//! The scripts as Redis receives them: `lua/*.lua` with every comment left out (a
//! comment-only line left empty) and no indentation. The comments and the layout are for
//! readers of the repository; every script is carried in the worker's bundle for EVAL after
//! NOSCRIPT, and they were more than half of its size there. Lines are kept, so a line number in a Redis error is the file's.
//! (No script has a long string spanning lines, whose text indentation would be part of;
//! the build refuses one.)
//!
//! A bound the scripts share with Rust is written in them by name, `RUST.quota.MAX_LIMIT` for
//! `redcount_core::ops::quota::MAX_LIMIT`, and replaced here by the constant's value as the
//! Rust source defines it, so the two cannot differ (`cargo xtask tidy` refuses a large
//! number written in a script instead).

use std::path::Path;

fn main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lua");
    let out = Path::new(&std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("lua");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    println!("cargo:rerun-if-changed={}", src.display());
    for entry in std::fs::read_dir(&src).expect("lua/ is beside the crates") {
        let path = entry.expect("lua/ is readable").path();
        if path.extension().is_none_or(|e| e != "lua") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).expect("a script is UTF-8");
        let mut kept = String::with_capacity(text.len());
        assert!(!text.contains("[["), "{}: a long string would lose its indentation", path.display());
        for line in text.lines() {
            kept.push_str(&with_constants(code_of(line), &path));
            kept.push('\n');
        }
        std::fs::write(out.join(path.file_name().expect("a file")), kept).expect("OUT_DIR is writable");
    }
}

/// A line without its indentation and its comment: everything from the first `--` that is
/// not inside a quoted string (the scripts have no long strings, see above).
fn code_of(line: &str) -> &str {
    let code = line.trim_start();
    let bytes = code.as_bytes();
    let mut quote = None;
    let mut i = 0;
    while i < bytes.len() {
        match (quote, bytes[i]) {
            (Some(_), b'\\') => i += 1, // the escaped byte is skipped
            (Some(q), b) if b == q => quote = None,
            (None, b @ (b'\'' | b'"')) => quote = Some(b),
            (None, b'-') if bytes.get(i + 1) == Some(&b'-') => return code[..i].trim_end(),
            _ => {}
        }
        i += 1;
    }
    code
}

/// `line` with each `RUST.module.NAME` replaced by the value of that Rust constant.
fn with_constants(line: &str, script: &Path) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("RUST.") {
        out.push_str(&rest[..at]);
        let name_end = rest[at + 5..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(rest.len(), |n| at + 5 + n);
        let (module, name) = rest[at + 5..name_end]
            .split_once('.')
            .unwrap_or_else(|| panic!("{}: `{}` is not RUST.module.NAME", script.display(), &rest[at..name_end]));
        out.push_str(&constant(module, name).to_string());
        rest = &rest[name_end..];
    }
    out.push_str(rest);
    out
}

/// The value of `pub const NAME` in the core's module `module` (`ops` for ops/mod.rs), read
/// from its source: an integer expression of literals, other constants of that module, `+ - *
/// / <<` and parentheses.
fn constant(module: &str, name: &str) -> i64 {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let file = [src.join("ops").join(format!("{module}.rs")), src.join(format!("{module}.rs"))]
        .into_iter()
        .find(|f| f.exists())
        .unwrap_or_else(|| {
            if module == "ops" { src.join("ops/mod.rs") } else { panic!("no module `{module}` in redcount-core") }
        });
    println!("cargo:rerun-if-changed={}", file.display());
    let text = std::fs::read_to_string(&file).expect("a module is readable");
    let start = format!("pub const {name}: ");
    let line = text
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no `pub const {name}` in {}", file.display()));
    let expr = line.split_once('=').and_then(|(_, e)| e.split_once(';')).map(|(e, _)| e).expect("one line");
    let tokens: Vec<String> = tokenize(expr);
    let mut at = 0;
    let value = sum(&tokens, &mut at, &|other| constant(module, other));
    assert_eq!(at, tokens.len(), "{module}::{name}: cannot read `{expr}`");
    value
}

fn tokenize(expr: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        let mut token = c.to_string();
        if c.is_ascii_alphanumeric() || c == '_' {
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_alphanumeric() || **d == '_') {
                token.push(d);
                chars.next();
            }
        } else if c == '<' {
            token.push(chars.next().expect("<<"));
        }
        tokens.push(token);
    }
    tokens
}

fn sum(t: &[String], at: &mut usize, named: &dyn Fn(&str) -> i64) -> i64 {
    let mut value = shift(t, at, named);
    while let Some(op @ ("+" | "-")) = t.get(*at).map(String::as_str) {
        *at += 1;
        let right = shift(t, at, named);
        value = if op == "+" { value + right } else { value - right };
    }
    value
}

fn shift(t: &[String], at: &mut usize, named: &dyn Fn(&str) -> i64) -> i64 {
    let mut value = product(t, at, named);
    while t.get(*at).is_some_and(|op| op == "<<") {
        *at += 1;
        value <<= product(t, at, named);
    }
    value
}

fn product(t: &[String], at: &mut usize, named: &dyn Fn(&str) -> i64) -> i64 {
    let mut value = atom(t, at, named);
    while let Some(op @ ("*" | "/")) = t.get(*at).map(String::as_str) {
        *at += 1;
        let right = atom(t, at, named);
        value = if op == "*" { value * right } else { value / right };
    }
    value
}

fn atom(t: &[String], at: &mut usize, named: &dyn Fn(&str) -> i64) -> i64 {
    let token = &t[*at];
    *at += 1;
    if token == "(" {
        let value = sum(t, at, named);
        assert_eq!(t.get(*at).map(String::as_str), Some(")"), "unbalanced parentheses");
        *at += 1;
        value
    } else if token.starts_with(|c: char| c.is_ascii_digit()) {
        token.replace('_', "").parse().expect("an integer literal")
    } else {
        named(token)
    }
}
