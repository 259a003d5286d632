//! `cargo xtask fuzz`: the cargo-fuzz targets, each for a bounded time.

use crate::setup::{self, root, run};

pub const TARGETS: &[&str] = &["rest_reply", "api_request", "front_request"];

/// Installs cargo-fuzz when missing.
fn ensure_cargo_fuzz() -> Result<(), String> {
    let ok = setup::cargo().args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("xtask: cargo install cargo-fuzz (a few minutes, once)");
        run(setup::cargo().args(["install", "cargo-fuzz"]))?;
    }
    Ok(())
}

/// Runs every target for `seconds` each. Inputs under `fuzz/regressions/<target>/` (crashes
/// found earlier, committed) are replayed first, so a fixed crash stays fixed.
pub fn fuzz(seconds: u64) -> Result<(), String> {
    ensure_cargo_fuzz()?;
    // The fuzz crate is a workspace of its own, so cargo keeps a lock file for it; one kept in
    // git went stale whenever a crate it builds changed its dependencies, and each run
    // rewrote it. It is made from the workspace's Cargo.lock instead (the versions the tests
    // use; cargo adds libfuzzer-sys's own), and ignored by git.
    std::fs::copy(root().join("Cargo.lock"), root().join("fuzz/Cargo.lock"))
        .map_err(|e| format!("cannot copy Cargo.lock into fuzz/: {e}"))?;
    for target in TARGETS {
        let corpus = setup::target_dir().join("fuzz-corpus").join(target);
        std::fs::create_dir_all(&corpus).map_err(|e| e.to_string())?;
        let regressions = root().join("fuzz/regressions").join(target);
        let seeds = root().join("fuzz/seeds").join(target);
        let mut cmd = setup::cargo();
        // libFuzzer needs sanitizer flags that stable rustc accepts only with RUSTC_BOOTSTRAP.
        cmd.env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", setup::target_dir().join("fuzz"))
            .args(["fuzz", "run", "--sanitizer", "none", target])
            .arg(&corpus);
        // The first directory receives new inputs; the committed ones are only read.
        for dir in [&seeds, &regressions] {
            if dir.is_dir() {
                cmd.arg(dir);
            }
        }
        cmd.args(["--", &format!("-max_total_time={seconds}"), "-max_len=4096", "-print_final_stats=1"]);
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        run(&mut cmd).map_err(|e| format!("fuzz target {target} found a crash (see fuzz/artifacts/{target}/): {e}"))?;
    }
    Ok(())
}
