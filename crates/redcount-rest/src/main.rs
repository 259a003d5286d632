//! `redcount-rest`: an Upstash-compatible REST front for Redis and Redis Cluster.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let config = redcount_rest::Config::parse();
    match redcount_rest::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redcount-rest: {e}");
            ExitCode::FAILURE
        }
    }
}
