//! The scripts as Redis receives them: `lua/*.lua` with every comment left out (a
//! comment-only line left empty) and no indentation. The comments and the layout are for
//! readers of the repository; every script is carried in the worker's bundle for EVAL after
//! NOSCRIPT, and they were more than half of its size there. Lines are kept, so a line number in a Redis error is the file's.
//! (No script has a long string spanning lines, whose text indentation would be part of;
//! the build refuses one.)

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
            kept.push_str(code_of(line));
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
