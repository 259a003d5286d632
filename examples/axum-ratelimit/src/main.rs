//! Serves [`axum_ratelimit::app`] (see its crate docs for the settings).

use std::net::SocketAddr;
use std::time::Duration;

use redcount::tower::Config;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    let config =
        Config::from_env(|v| env(v).or_else(|| (v == "REDCOUNT_POLICIES").then(|| axum_ratelimit::POLICIES.into())))?;
    let app = match (env("REDCOUNT_REST_URL"), env("REDCOUNT_REST_TOKEN")) {
        (Some(url), Some(token)) => axum_ratelimit::app(axum_ratelimit::limit(
            redcount::Rest::new(&url, &token, Duration::from_secs(5))?,
            &config,
        )?),
        _ => {
            let url = env("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
            axum_ratelimit::app(axum_ratelimit::limit(redcount::Direct::connect(&url).await?, &config)?)
        }
    };
    let port: u16 = env("PORT").map_or(Ok(3000), |p| p.parse())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://127.0.0.1:{port}");
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
