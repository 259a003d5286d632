//! The scripts as Redis receives them: `lua/*.lua` with every comment-only line left empty
//! and no indentation. The comments and the layout are for readers of the repository; every
//! script is carried in the worker's bundle for EVAL after NOSCRIPT, and they were more than
//! half of its size there. Lines are kept, so a line number in a Redis error is the file's.
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
            let code = line.trim_start();
            // Only whole-line comments: a `--` after code may be inside a string.
            if !code.starts_with("--") {
                kept.push_str(code);
            }
            kept.push('\n');
        }
        std::fs::write(out.join(path.file_name().expect("a file")), kept).expect("OUT_DIR is writable");
    }
}
