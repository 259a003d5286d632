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
    }
    std::process::ExitCode::SUCCESS
}
