//! Writes every script's text as the worker's static assets: `<dir>/<sha1>.lua`, one file per
//! script, named by the SHA-1 EVALSHA uses (stale files of other builds removed). The worker's
//! wasm carries only the SHA-1s; after a NOSCRIPT its shell fetches the text from here and the
//! API checks it against the SHA-1 before sending EVAL. `cargo xtask build-worker` runs this
//! with `www/lua`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: script-assets DIR");
        return ExitCode::from(2);
    };
    match write(&dir) {
        Ok(n) => {
            println!("wrote {n} scripts to {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("script-assets: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn write(dir: &std::path::Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "lua") {
            std::fs::remove_file(path)?;
        }
    }
    for script in redcount_core::script::ALL {
        std::fs::write(dir.join(format!("{}.lua", script.sha1())), script.source())?;
    }
    Ok(redcount_core::script::ALL.len())
}
