//! `redcount`: the native command line.
use clap::{Parser, Subcommand};

/// redcount: atomic counting primitives for Redis, natively.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the Lua scripts with the SHA-1 that EVALSHA uses.
    Scripts,
    /// Load every script into a Redis script cache (SCRIPT LOAD), checking each SHA-1.
    Load {
        /// Redis URL.
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
    },
    /// Benchmarks: the same scripts over direct RESP and through a REST front, side by side.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Red-packet grabs and quota calls: direct RESP vs an Upstash-compatible REST front.
    Rest {
        /// Redis URL (direct RESP).
        #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
        redis: String,
        /// REST front URL, in front of the same Redis.
        #[arg(long, env = "REDCOUNT_REST_URL")]
        rest_url: String,
        /// REST token.
        #[arg(long, env = "REDCOUNT_REST_TOKEN", hide_env_values = true)]
        rest_token: String,
        /// Concurrent clients.
        #[arg(long, default_value_t = 50)]
        concurrency: usize,
        /// Operations per scenario and transport.
        #[arg(long, default_value_t = 20_000)]
        ops: usize,
        /// Also write the table to this Markdown file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Scripts => {
            for s in redcount_core::script::ALL {
                println!("{}  {}", s.sha1(), s.name());
            }
        }
        Cmd::Load { redis } => {
            let direct = match redcount::Direct::connect(&redis).await {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("redcount: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            for s in redcount_core::script::ALL {
                let cmd = redcount_core::Command::new("SCRIPT").arg("LOAD").arg(s.source());
                match direct.send(&cmd).await {
                    Ok(redcount_core::Value::Bytes(sha)) if sha == s.sha1().as_bytes() => {
                        println!("loaded {}", s.name())
                    }
                    Ok(other) => {
                        eprintln!("redcount: {} loaded under an unexpected SHA: {other:?}", s.name());
                        return std::process::ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("redcount: loading {}: {e}", s.name());
                        return std::process::ExitCode::FAILURE;
                    }
                }
            }
        }
        Cmd::Bench { which: BenchCmd::Rest { redis, rest_url, rest_token, concurrency, ops, out } } => {
            if let Err(e) = bench_rest(&redis, &rest_url, &rest_token, concurrency, ops, out).await {
                eprintln!("redcount: bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    std::process::ExitCode::SUCCESS
}

async fn bench_rest(
    redis: &str,
    rest_url: &str,
    token: &str,
    concurrency: usize,
    ops: usize,
    out: Option<std::path::PathBuf>,
) -> Result<(), redcount::Error> {
    use redcount::bench::{self, Measurement, ms};
    let direct = || async {
        let mut v = Vec::new();
        for _ in 0..concurrency {
            v.push(redcount::Direct::connect(redis).await?);
        }
        Ok::<_, redcount::Error>(v)
    };
    let rest = || async {
        let mut v = Vec::new();
        for _ in 0..concurrency {
            v.push(bench::LeanRest::connect(rest_url, token).await?);
        }
        Ok::<_, redcount::Error>(v)
    };
    // Warm up both paths (script caches, connections).
    bench::grab_storm("warm", direct().await?, 2_000).await?;
    bench::grab_storm("warm", rest().await?, 2_000).await?;
    let mut rows: Vec<Measurement> = Vec::new();
    // Interleaved, so drift on a noisy machine hits both transports alike.
    for round in 0..3 {
        eprintln!("round {}/3 …", round + 1);
        rows.push(bench::grab_storm("direct RESP", direct().await?, ops).await?);
        rows.push(bench::grab_storm("REST front", rest().await?, ops).await?);
        rows.push(bench::quota_burst("direct RESP", direct().await?, ops).await?);
        rows.push(bench::quota_burst("REST front", rest().await?, ops).await?);
    }
    let mut table = format!(
        "concurrency {concurrency}, {ops} ops per row\n\n| scenario | transport | ops/s | p50 ms | p99 ms | errors | successes |\n|---|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        table.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} |\n",
            r.scenario,
            r.transport,
            r.ops_per_sec(),
            ms(r.p50),
            ms(r.p99),
            r.errors,
            r.successes
        ));
    }
    table.push_str("\n| scenario | REST/direct throughput | p99 added by the front (ms) |\n|---|---|---|\n");
    for scenario in ["redpacket grab", "quota take"] {
        let pick = |t: &str| rows.iter().filter(|r| r.scenario == scenario && r.transport == t).collect::<Vec<_>>();
        let (d, r) = (pick("direct RESP"), pick("REST front"));
        let tput = |v: &[&Measurement]| v.iter().map(|m| m.ops_per_sec()).sum::<f64>() / v.len() as f64;
        let p99 = |v: &[&Measurement]| v.iter().map(|m| m.p99.as_secs_f64() * 1000.0).sum::<f64>() / v.len() as f64;
        table.push_str(&format!("| {scenario} | {:.2}x | {:+.3} |\n", tput(&r) / tput(&d), p99(&r) - p99(&d)));
    }
    print!("{table}");
    if let Some(path) = out {
        std::fs::write(&path, &table).map_err(|e| redcount::Error::Io(e.to_string()))?;
    }
    Ok(())
}
