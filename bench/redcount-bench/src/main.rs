//! `redcount-bench`: the benchmarks `cargo xtask bench` runs, each against servers it is given
//! (the xtask starts them): the same scripts over direct RESP, through a REST front and through
//! the worker, side by side. Not part of the shipped `redcount` command.
use clap::{Parser, Subcommand};

/// redcount's benchmarks: the same scripts over direct RESP, through a REST front and through
/// the worker, side by side.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Every scenario (red-packet storm, quota burst, counter floor) through every variant:
    /// Lua over RESP, via a REST front, via the worker, and the naive client-side ways.
    All {
        /// Redis URL (RESP variants, and the invariant checks).
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
        /// redcount-rest in front of the same Redis (token: REDCOUNT_REST_TOKEN).
        #[arg(long)]
        rest_url: Option<String>,
        /// The redcount worker under wrangler dev (admin token: REDCOUNT_ADMIN_TOKEN).
        #[arg(long)]
        worker_url: Option<String>,
        /// The @upstash/ratelimit peer worker.
        #[arg(long)]
        peer_url: Option<String>,
        /// Operations per row.
        #[arg(long, default_value_t = 10_000)]
        ops: usize,
        /// Concurrent clients.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
        /// Write the Markdown table here.
        #[arg(long)]
        out_md: Option<std::path::PathBuf>,
        /// Write the SVG chart here.
        #[arg(long)]
        out_svg: Option<std::path::PathBuf>,
    },
    /// Only Redis's own time per script call at the policy maxima (the section `all` ends with),
    /// printed as Markdown: every script's bound checked without the rest of the suite.
    RedisTime {
        /// Redis URL (a scratch Redis: the rows fill logs of thousands of entries).
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
    },
    /// The redcount worker, the @upstash/ratelimit peer and a one-fetch floor worker (each
    /// served by workerd) at several connection counts in interleaved rounds, plus one row of
    /// the redcount worker under wrangler dev; a quota call per request, never denied.
    Workers {
        /// The redcount worker.
        #[arg(long)]
        worker_url: String,
        /// The @upstash/ratelimit peer worker.
        #[arg(long)]
        peer_url: String,
        /// The floor worker (one fetch to the REST front per request).
        #[arg(long)]
        floor_url: String,
        /// A worker that answers without any I/O (workerd's own latency and pauses), if any
        #[arg(long)]
        null_url: Option<String>,
        /// The redcount worker under wrangler dev, for a reference row.
        #[arg(long)]
        wrangler_dev_url: Option<String>,
        /// Connection counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1, 10, 50])]
        conns: Vec<usize>,
        /// Rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Requests per measurement at one connection (2.5 times as many at 10 and more).
        #[arg(long, default_value_t = 3_000)]
        ops: usize,
        /// Also write the tables to this Markdown file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Red-packet grabs and quota calls: direct RESP vs an Upstash-compatible REST front.
    Rest {
        /// Redis URL (direct RESP).
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
        #[command(flatten)]
        front: FrontLoad,
    },
    /// Counter adds and red-packet grabs over direct RESP, without and with `--wait-replicas 1`
    /// (interleaved rounds): throughput, latency and each Redis's CPU time per call.
    Replicas {
        /// The master's URL.
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
        /// Its replica's URL (for its CPU time, and to wait until it is in sync).
        #[arg(long)]
        replica: String,
        /// WAIT's timeout, in ms.
        #[arg(long, default_value_t = 250)]
        wait_ms: u64,
        #[command(flatten)]
        load: Load,
    },
    /// redcount-rest beside webdis in front of the same Redis: INCR and EVALSHA of the quota
    /// take, interleaved rounds; throughput and each front's CPU time per request (from /proc)
    Fronts {
        /// redcount-rest's process id (its CPU time is read from /proc).
        #[arg(long)]
        rest_pid: u32,
        /// webdis's URL (in front of the same Redis).
        #[arg(long)]
        webdis_url: String,
        /// webdis's process id.
        #[arg(long)]
        webdis_pid: u32,
        #[command(flatten)]
        front: FrontLoad,
    },
}

/// A REST front under load, as `bench rest` and `bench fronts` drive it.
#[derive(clap::Args, Debug)]
struct FrontLoad {
    /// The REST front's URL (redcount-rest), in front of the same Redis.
    #[arg(long, env = "REDCOUNT_REST_URL")]
    rest_url: String,
    /// Its token.
    #[arg(long, env = "REDCOUNT_REST_TOKEN", hide_env_values = true)]
    rest_token: String,
    #[command(flatten)]
    load: Load,
}

/// How hard a benchmark loads what it measures.
#[derive(clap::Args, Debug)]
struct Load {
    /// Concurrent clients.
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Requests per measurement (per scenario and transport for `bench rest`).
    #[arg(long, default_value_t = 20_000)]
    ops: usize,
    /// Also write the table to this Markdown file.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    redcount::tls::install_crypto_provider();
    let cli = Cli::parse();
    // The load generator stays on one thread: its figures were measured that way, and it
    // leaves the other core to what it measures.
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(run(cli.command)),
        Err(e) => {
            eprintln!("redcount-bench: cannot start the runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Cmd) -> std::process::ExitCode {
    match command {
        Cmd::All { redis, rest_url, worker_url, peer_url, ops, concurrency, out_md, out_svg } => {
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            let targets = redcount_bench::suite::Targets {
                redis,
                rest: rest_url.map(|u| (u, env("REDCOUNT_REST_TOKEN").unwrap_or_default())),
                worker: worker_url.map(|u| (u, env("REDCOUNT_ADMIN_TOKEN").unwrap_or_default())),
                peer: peer_url,
            };
            let shape = redcount_bench::harness::Shape { ops, concurrency };
            match redcount_bench::suite::run_all(&targets, shape).await {
                Ok(rows) => {
                    let mut md = redcount_bench::suite::markdown(&rows, shape);
                    match redcount_bench::suite::redis_time(&targets.redis).await {
                        Ok(section) => md.push_str(&section),
                        Err(e) => {
                            eprintln!("redcount-bench: Redis time per call: {e}");
                            return std::process::ExitCode::FAILURE;
                        }
                    }
                    print!("{md}");
                    let write = |p: &Option<std::path::PathBuf>, text: String| match p {
                        Some(p) => std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display())),
                        None => Ok(()),
                    };
                    if let Err(e) = write(&out_md, md).and(write(&out_svg, redcount_bench::suite::svg(&rows))) {
                        eprintln!("redcount-bench: {e}");
                        return std::process::ExitCode::FAILURE;
                    }
                }
                Err(e) => {
                    eprintln!("redcount-bench: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
        Cmd::RedisTime { redis } => match redcount_bench::suite::redis_time(&redis).await {
            Ok(section) => print!("{section}"),
            Err(e) => {
                eprintln!("redcount-bench: Redis time per call: {e}");
                return std::process::ExitCode::FAILURE;
            }
        },
        Cmd::Workers { worker_url, peer_url, floor_url, null_url, wrangler_dev_url, conns, rounds, ops, out } => {
            use redcount_bench::workers::{self, Plan, Target};
            let quota = |name, url| Target { name, url, path: "/api/quotas/bench-quota", field: Some("allowed") };
            let mut targets = vec![
                quota("redcount worker", worker_url),
                Target { name: "@upstash/ratelimit worker", url: peer_url, path: "/limit", field: Some("allowed") },
                Target { name: "floor: one fetch", url: floor_url, path: "/floor", field: None },
            ];
            if let Some(url) = null_url {
                targets.push(Target { name: "workerd alone: no I/O", url, path: "/none", field: None });
            }
            let plan = Plan {
                targets,
                wrangler_dev: wrangler_dev_url.map(|u| quota("redcount worker", u)),
                conns,
                rounds,
                ops,
                reference_conns: 10,
            };
            let md = workers::run(&plan).await.map(|(series, reference)| {
                workers::markdown(
                    &series,
                    reference.as_ref(),
                    "redcount worker",
                    "@upstash/ratelimit worker",
                    "floor: one fetch",
                )
            });
            if !print_table(md, out) {
                return std::process::ExitCode::FAILURE;
            }
        }
        Cmd::Fronts {
            rest_pid,
            webdis_url,
            webdis_pid,
            front: FrontLoad { rest_url, rest_token, load: Load { concurrency, ops, out } },
        } => {
            use redcount_bench::{harness::Shape, rest};
            let fronts = rest::Fronts { rest_url, token: rest_token, rest_pid, webdis_url, webdis_pid };
            if !print_table(rest::fronts(&fronts, Shape { ops, concurrency }).await, out) {
                return std::process::ExitCode::FAILURE;
            }
        }
        Cmd::Replicas { redis, replica, wait_ms, load: Load { concurrency, ops, out } } => {
            use redcount_bench::{harness::Shape, replicas};
            if !print_table(replicas::run(&redis, &replica, wait_ms, Shape { ops, concurrency }).await, out) {
                return std::process::ExitCode::FAILURE;
            }
        }
        Cmd::Rest { redis, front: FrontLoad { rest_url, rest_token, load: Load { concurrency, ops, out } } } => {
            if let Err(e) = bench_rest(&redis, &rest_url, &rest_token, concurrency, ops, out).await {
                eprintln!("redcount-bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

/// Prints a benchmark's Markdown table and writes it to `out` too; false (said on stderr)
/// when the benchmark failed or the file could not be written.
fn print_table(table: Result<String, redcount_bench::Error>, out: Option<std::path::PathBuf>) -> bool {
    let table = match table {
        Ok(t) => t,
        Err(e) => {
            eprintln!("redcount-bench: {e}");
            return false;
        }
    };
    print!("{table}");
    if let Some(p) = out
        && let Err(e) = std::fs::write(&p, table)
    {
        eprintln!("redcount-bench: {}: {e}", p.display());
        return false;
    }
    true
}

async fn bench_rest(
    redis: &str,
    rest_url: &str,
    token: &str,
    concurrency: usize,
    ops: usize,
    out: Option<std::path::PathBuf>,
) -> Result<(), redcount_bench::Error> {
    use redcount_bench::{harness::Shape, rest};
    let shape = Shape { ops, concurrency };
    let table = rest::markdown(&rest::run(redis, rest_url, token, shape).await?, shape);
    print!("{table}");
    if let Some(path) = out {
        std::fs::write(&path, &table)
            .map_err(|e| redcount_bench::Error::Failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
