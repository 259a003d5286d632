//! Building the Cloudflare Worker on either toolchain path: the crate for wasm32 with cargo
//! (`core` and `alloc` built from source with it), its JS glue with wasm-bindgen-cli,
//! `wasm-opt -Oz`, and the hand-written shell beside them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::setup::{self, have, root, run};

/// The wasm-bindgen version Cargo.lock pins: wasm-bindgen-cli must match it exactly.
fn locked_wasm_bindgen() -> Result<String, String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l == "name = \"wasm-bindgen\""
            && let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_string());
        }
    }
    Err("wasm-bindgen is not in Cargo.lock".into())
}

fn cargo_bin(name: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo"));
    home.join("bin").join(name)
}

fn version_of(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    // `wasm-bindgen 0.2.130`: the last word.
    String::from_utf8(out.stdout).ok()?.split_whitespace().last().map(str::to_string)
}

/// `cargo install` of an exact version, unless that version is already there.
fn ensure_cargo_tool(krate: &str, bin: &str, version: &str) -> Result<PathBuf, String> {
    let path = cargo_bin(bin);
    if version_of(&path).as_deref() == Some(version) {
        return Ok(path);
    }
    eprintln!("xtask: cargo install {krate} {version} (a few minutes, once)");
    // Not --locked: the tools' own lockfiles can name yanked versions; the exact tool
    // version is what has to match.
    run(setup::cargo().args(["install", krate, "--version", version]))?;
    Ok(path)
}

/// Where the source of `core` and `alloc` comes from: the worker builds them for wasm32 itself
/// (see [`build`]), on either path.
enum Toolchain {
    /// rustup with its `rust-src` component: the ordinary path.
    Rustup,
    /// Debian's rustc-web with its shipped source.
    DebianBuildStd,
}

fn toolchain() -> Result<Toolchain, String> {
    // `REDCOUNT_WASM_TOOLCHAIN=debian` takes the fallback even where rustup has the source (to
    // check that path on a machine that has both).
    let forced = std::env::var("REDCOUNT_WASM_TOOLCHAIN").is_ok_and(|v| v == "debian");
    let installed = !forced
        && Command::new("rustup")
            .args(["component", "list", "--installed"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == "rust-src"));
    if installed {
        return Ok(Toolchain::Rustup);
    }
    // Try the ordinary path once, briefly: where rustup can download, this is all it takes.
    if !forced && have("rustup") && have("timeout") {
        eprintln!("xtask: rustup component add rust-src (60 s at most)");
        let ok = Command::new("timeout")
            .args(["60", "rustup", "component", "add", "rust-src"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(Toolchain::Rustup);
        }
        eprintln!("xtask: rustup could not add rust-src; using Debian's rustc-web");
    }
    if !Path::new("/usr/lib/rustlib/src/rust/library").exists() || !Path::new("/usr/bin/cargo").exists() {
        setup::apt_install(&["rustc-web", "cargo-web", "rust-web-src", "lld-22"])?;
    }
    Ok(Toolchain::DebianBuildStd)
}

/// Most the worker bundle may weigh, gzipped: Cloudflare's free plan takes 3 MB, but every
/// cold start pays for each byte, and growth here is the first sign of a heavy dependency.
/// The goal itself: the bundle is a little under it (99.4 KB), so it cannot drift past it.
pub const MAX_BUNDLE_GZ: u64 = 100 * 1024;

/// Builds the worker into `crates/redcount-worker/build/` (`index.js`: the crate's
/// `shell.js` bundled with what it uses of wasm-bindgen's glue; `redcount_worker_bg.wasm`), prints
/// the bundle size, and fails when it is over [`MAX_BUNDLE_GZ`]. Returns the bundle's raw and
/// gzipped bytes.
pub fn build() -> Result<(u64, u64), String> {
    setup::ensure_npm()?;
    let wb_version = locked_wasm_bindgen()?;
    let wasm_bindgen = ensure_cargo_tool("wasm-bindgen-cli", "wasm-bindgen", &wb_version)?;
    let crate_dir = root().join("crates/redcount-worker");
    let target_dir = root().join("target/worker");
    let toolchain = toolchain()?;
    let mut cmd = match toolchain {
        Toolchain::Rustup => setup::cargo(),
        Toolchain::DebianBuildStd => Command::new("/usr/bin/cargo"),
    };
    cmd.args(["build", "--lib", "--release", "-p", "redcount-worker", "--target", "wasm32-unknown-unknown"])
        .current_dir(root())
        .env("CARGO_TARGET_DIR", &target_dir)
        // The bundle ships over the wire: optimise every crate (std too) for size, not
        // only the worker's own code; no unwinding tables; no symbols.
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "z")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        // `core` and `alloc` built here, where a panic is a trap at the spot (the crate's panic
        // handler was one already): no panic messages, locations or formatting behind them,
        // in the libraries or in this workspace. On wasm the crate is no_std, so these two are
        // all of the standard library it links. The same on both paths, so both bundles are
        // the same size.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_UNSTABLE_BUILD_STD", "core,alloc")
        // Their size-minded implementations where the libraries have two (1.3 KB gzipped off).
        .env("CARGO_UNSTABLE_BUILD_STD_FEATURES", "optimize_for_size")
        .env("CARGO_ENCODED_RUSTFLAGS", "-Zunstable-options\x1f-Cpanic=immediate-abort");
    if let Toolchain::DebianBuildStd = toolchain {
        // rustc links wasm with `rust-lld`, which Debian's rustc-web does not always provide:
        // lld-22's `wasm-ld` is the same linker in its wasm flavour.
        if !have("rust-lld") && Path::new("/usr/bin/wasm-ld-22").exists() {
            cmd.env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", "/usr/bin/wasm-ld-22");
        }
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("/usr/bin:{path}"))
            .env_remove("RUSTC")
            .env_remove("RUSTDOC")
            .env_remove("RUSTUP_TOOLCHAIN");
    }
    run(&mut cmd)?;
    let out = crate_dir.join("build");
    // Nothing stale beside the new files (an older build's layout included).
    let _ = std::fs::remove_dir_all(&out);
    run(Command::new(&wasm_bindgen)
        .arg(target_dir.join("wasm32-unknown-unknown/release/redcount_worker.wasm"))
        // `web`: ES module glue with `initSync`, which shell.js calls with the module the
        // runtime compiled from the imported .wasm (no fetch of the wasm at run time).
        .args(["--target", "web", "--no-typescript", "--out-dir"])
        .arg(&out))?;
    optimize(&out.join("redcount_worker_bg.wasm"))?;
    std::fs::copy(crate_dir.join("shell.js"), out.join("index.js")).map_err(|e| format!("shell.js: {e}"))?;
    // One JS module: the shell with the parts of wasm-bindgen's glue it uses (tree-shaken: not
    // the glue's async loader, which fetches the wasm; the shell instantiates it with
    // `initSync`), minified: the comments are for the repository's readers (they were a
    // twentieth of the bundle), and short local names save a sixth of what is left. The
    // module's export names (`Redcount`, `default`) are its interface and stay; `--keep-names`
    // would keep every function's name for stack traces at two thirds of that saving.
    let index = out.join("index.js");
    run(Command::new(root().join("node_modules/.bin/esbuild"))
        .arg(&index)
        .args([
            "--bundle",
            "--format=esm",
            "--platform=neutral",
            "--external:cloudflare:workers",
            "--external:./redcount_worker_bg.wasm",
            "--minify",
            "--log-level=warning",
            "--allow-overwrite",
        ])
        .arg(format!("--outfile={}", index.display())))?;
    std::fs::remove_file(out.join("redcount_worker.js")).map_err(|e| format!("redcount_worker.js: {e}"))?;
    // The scripts' texts, outside the bundle: the static assets the worker fetches one from
    // after a NOSCRIPT (see the crate's `script-assets`).
    run(setup::cargo()
        .args(["run", "--quiet", "-p", "redcount-worker", "--bin", "script-assets", "--"])
        .arg(root().join("www/lua"))
        .current_dir(root()))?;
    let (raw, gz) = report_size(&out)?;
    if gz > MAX_BUNDLE_GZ {
        return Err(format!(
            "the worker bundle is {:.1} KB gzipped, over the {} KB limit: find what grew (e.g. `twiggy top` on \
             target/worker/wasm32-unknown-unknown/release/redcount_worker.wasm)",
            gz as f64 / 1024.0,
            MAX_BUNDLE_GZ / 1024
        ));
    }
    Ok((raw, gz))
}

/// `wasm-opt` for size (binaryen from npm; Debian's is too old for wasm-bindgen's output), run
/// until it stops shrinking, dropping debug names: about a third off the wasm.
fn optimize(wasm: &Path) -> Result<(), String> {
    let opt = root().join("node_modules/.bin/wasm-opt");
    let out = wasm.with_extension("opt.wasm");
    let status = Command::new(&opt)
        // `-Os` compresses better than `-Oz` here (0.1 KB gzipped); functions that differ only
        // in constants merged into one (0.1 KB); and the control flow rebuilt once flat, by the
        // relooper, then optimised again (0.4 KB, as binaryen's -O4 does). All are binaryen's
        // semantics-preserving passes; `--flatten` stops with an error on a `try_table` (the
        // module has none today), so that change would fail this build, not the worker.
        .args(["--merge-similar-functions", "-Os", "--flatten", "--rereloop", "-Os", "--converge"])
        .args(["--strip-debug", "--strip-producers"])
        // Folds constant offsets into loads and stores (`load(p + 8)` to `load offset=8 p`),
        // which changes a program only where `p + 8` would wrap past 4 GB: no pointer of the
        // worker's is within 1 KB of that (its memory is a few MB, the stack below the data).
        .arg("--low-memory-unused")
        // The features wasm-bindgen's output uses (catch wrappers need exception handling).
        .args([
            "--enable-exception-handling",
            "--enable-reference-types",
            "--enable-bulk-memory",
            "--enable-nontrapping-float-to-int",
            "--enable-sign-ext",
            "--enable-mutable-globals",
            "--enable-multivalue",
        ])
        .arg(wasm)
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", opt.display()))?;
    if !status.success() {
        return Err(format!("wasm-opt failed on {} (run it by hand to see why)", wasm.display()));
    }
    std::fs::rename(&out, wasm).map_err(|e| e.to_string())
}

/// Prints the bundle size (wasm + JS, raw and gzipped, each file `gzip -9`) and returns it.
fn report_size(dir: &Path) -> Result<(u64, u64), String> {
    let mut files = Vec::new();
    collect(dir, &mut files);
    let (mut raw, mut gz) = (0u64, 0u64);
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "wasm" || e == "js" || e == "mjs")) {
        raw += std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        let out =
            Command::new("gzip").args(["-9", "-c"]).arg(f).output().map_err(|e| format!("cannot run gzip: {e}"))?;
        gz += out.stdout.len() as u64;
    }
    println!(
        "worker bundle: {:.1} KB raw, {:.1} KB gzipped (limit: {} KB gzipped)",
        raw as f64 / 1024.0,
        gz as f64 / 1024.0,
        MAX_BUNDLE_GZ / 1024
    );
    Ok((raw, gz))
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() { collect(&p, out) } else { out.push(p) }
        }
    }
}
