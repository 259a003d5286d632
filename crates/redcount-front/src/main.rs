//! `redcount-rest`: an Upstash-compatible REST front for Redis and Redis Cluster.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc rather than glibc's malloc: a quarter of the front's instructions per request
/// went to glibc's malloc and free (callgrind, BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // rustls with ring, for rediss:// upstreams and --tls-cert.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = redcount_front::Config::parse();
    let mut rt = if config.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if config.threads > 1 {
            b.worker_threads(config.threads);
        }
        b
    };
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redcount-rest: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(redcount_front::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redcount-rest: {e}");
            ExitCode::FAILURE
        }
    }
}
