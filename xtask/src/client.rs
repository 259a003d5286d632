//! The npm client (packages/client): built with the pinned TypeScript, `npm pack`ed, and its
//! tarball installed into the examples that use it (examples/caller-worker,
//! examples/llm-gateway), which the tests bundle as a user would.

use std::path::PathBuf;
use std::process::Command;

use crate::setup::{root, run, target_dir};

/// The examples that depend on the client.
const EXAMPLES: [&str; 2] = ["caller-worker", "llm-gateway"];

/// Checks src/generated.ts against openapi.json, compiles the package into dist/ with the
/// worker's module (crates/redcount-worker/build) as dist/engine/, packs it
/// unpacks the tarball as each example's `@redcount/client` and type-checks the example with
/// it. Returns the tarball.
pub fn build() -> Result<PathBuf, String> {
    let root = root();
    let package = root.join("packages/client");
    run(Command::new("node").arg(package.join("scripts/generate.mjs")).arg("--check"))?;
    run(Command::new(root.join("node_modules/.bin/tsc")).arg("-p").arg(package.join("tsconfig.json")))?;
    // `@redcount/client/engine`: the worker's module as build-worker leaves it, beside engine.js.
    let engine = package.join("dist/engine");
    let _ = std::fs::remove_dir_all(&engine);
    std::fs::create_dir_all(&engine).map_err(|e| e.to_string())?;
    let build = root.join("crates/redcount-worker/build");
    for (from, to) in [("index.js", "worker.js"), ("redcount_worker_bg.wasm", "redcount_worker_bg.wasm")] {
        std::fs::copy(build.join(from), engine.join(to))
            .map_err(|e| format!("{}: {e} (run cargo xtask build-worker first)", build.join(from).display()))?;
    }
    // And the scripts it would fetch from its static assets after a NOSCRIPT, by SHA-1.
    let mut scripts = String::from("export default {\n");
    let lua = root.join("www/lua");
    let mut names: Vec<_> = std::fs::read_dir(&lua)
        .map_err(|e| format!("{}: {e} (run cargo xtask build-worker first)", lua.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .collect();
    names.sort();
    for path in names {
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        let sha = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let quoted = serde_json::to_string(&text).map_err(|e| e.to_string())?;
        scripts.push_str(&format!("  \"{sha}\": {quoted},\n"));
    }
    scripts.push_str("};\n");
    std::fs::write(engine.join("scripts.js"), scripts).map_err(|e| e.to_string())?;
    let packed = target_dir().join("client");
    let _ = std::fs::remove_dir_all(&packed);
    std::fs::create_dir_all(&packed).map_err(|e| e.to_string())?;
    let out = Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(&packed)
        .current_dir(&package)
        .output()
        .map_err(|e| format!("cannot run npm pack: {e}"))?;
    if !out.status.success() {
        return Err(format!("npm pack failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let name = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_string();
    let tarball = packed.join(&name);
    if name.is_empty() || !tarball.is_file() {
        return Err(format!("npm pack made no tarball in {}", packed.display()));
    }
    for example in EXAMPLES {
        // Unpacked as npm would install it (hono, its peer, resolves from the root's node_modules).
        let dir = root.join("examples").join(example);
        let into = dir.join("node_modules/@redcount/client");
        let _ = std::fs::remove_dir_all(&into);
        std::fs::create_dir_all(&into).map_err(|e| e.to_string())?;
        run(Command::new("tar").arg("xzf").arg(&tarball).arg("--strip-components=1").arg("-C").arg(&into))?;
        // The example type-checks against the packed client (as README.md shows it).
        run(Command::new(root.join("node_modules/.bin/tsc")).arg("-p").arg(&dir))?;
        eprintln!("xtask: {} into examples/{example}", tarball.display());
    }
    Ok(tarball)
}
