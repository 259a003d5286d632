//! `/metrics` (Prometheus text on `--metrics-listen`) and `tracing` logs (`--log-format
//! json`) of both servers: exact counts after known traffic, bounded labels, no secret in
//! either.

use std::collections::BTreeMap;
use std::time::Duration;

use redcount_tests::{NativeServer, RedisServer, RestFront, TEST_POLICIES, free_port, secret};
use serde_json::{Value, json};

/// One sample: its metric name and labels.
type Sample = (String, BTreeMap<String, String>);

/// Parses Prometheus text into samples (comments skipped).
fn parse(text: &str) -> Vec<(Sample, f64)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (head, value) = line.rsplit_once(' ').expect("name and value");
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let labels = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').expect("label");
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect();
        out.push(((name.to_string(), labels), value.parse().expect("a number")));
    }
    out
}

/// The value of `name` with exactly these labels among its own (others ignored), or 0.
fn value(samples: &[(Sample, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|((n, l), _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, v)| v)
        .sum()
}

async fn scrape(port: u16) -> (String, Vec<(Sample, f64)>) {
    let text = redcount_tests::http()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse(&text);
    (text, samples)
}

async fn post(url: String, token: Option<&str>, body: String) -> (u16, Value) {
    let mut r = redcount_tests::http().post(url).body(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_front_counts_what_it_served_and_logs_json_without_secrets() {
    let redis = RedisServer::start();
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    let front = RestFront::start_with(
        &redis.url(),
        false,
        // The harness already asks for `--log debug`.
        &["--metrics-listen", &listen, "--log-format", "json"],
    );
    let url = format!("{}/", front.url());
    for _ in 0..3 {
        assert_eq!(post(url.clone(), Some(&front.token), r#"["PING"]"#.into()).await.0, 200);
    }
    assert_eq!(post(url.clone(), Some(&front.token), r#"["SET","h","v"]"#.into()).await.0, 200);
    assert_eq!(post(url.clone(), Some(&front.token), r#"["HGET","h","f"]"#.into()).await.0, 400, "WRONGTYPE");
    assert_eq!(post(url.clone(), Some("not-the-token-0123456789"), r#"["PING"]"#.into()).await.0, 401);
    let pipeline = format!("{}/pipeline", front.url());
    assert_eq!(post(pipeline, Some(&front.token), r#"[["PING"],["PING"]]"#.into()).await.0, 200);

    let (text, m) = scrape(metrics).await;
    let requests = "redcount_rest_requests_total";
    assert_eq!(value(&m, requests, &[("route", "/"), ("status", "200")]), 4.0, "{text}");
    assert_eq!(value(&m, requests, &[("route", "/"), ("status", "400")]), 1.0, "{text}");
    assert_eq!(value(&m, requests, &[("route", "/"), ("status", "401")]), 1.0, "{text}");
    assert_eq!(value(&m, requests, &[("route", "/pipeline"), ("status", "200")]), 1.0, "{text}");
    assert_eq!(value(&m, "redcount_rest_request_duration_seconds_count", &[("route", "/")]), 6.0, "{text}");
    assert_eq!(value(&m, "redcount_rest_redis_errors_total", &[("kind", "wrongtype")]), 1.0, "{text}");
    assert!(m.iter().any(|((n, _), _)| n == "redcount_http_open_connections"), "{text}");
    // Labels come from fixed sets: a made-up command name adds no series.
    assert_eq!(post(url.clone(), Some(&front.token), r#"["NOSUCHCOMMAND_XYZ"]"#.into()).await.0, 400);
    let (text, _) = scrape(metrics).await;
    assert!(!text.contains("NOSUCHCOMMAND_XYZ"), "{text}");
    // A path whose first segment forges a log line stays on one line, its breaks replaced.
    let forged = format!("{}/foo%0A2026-01-01T00:00:00Z%20ERROR%20forged", front.url());
    post(forged, Some(&front.token), String::new()).await;
    assert!(!text.contains(&front.token) && !text.contains(&front.readonly_token), "a token in the metrics");

    // A token sent where a command's name goes (a client that put it in its URL path or body)
    // is no command: the log does not name it, in any case.
    let token_path = format!("{}/{}/get/k", front.url(), front.token);
    assert_eq!(post(token_path, Some(&front.token), String::new()).await.0, 400);
    assert_eq!(post(url.clone(), Some(&front.token), format!(r#"["{}"]"#, front.readonly_token)).await.0, 400);

    // Logs: JSON lines, one per request at debug, never a token (upper-cased neither).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = front.log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let requests: Vec<&Value> = lines.iter().filter(|l| l["fields"]["message"] == "request").collect();
    assert_eq!(requests.len(), 11, "{log}");
    assert!(requests.iter().all(|l| l["fields"]["command"].as_str().is_some_and(|c| !c.contains(' '))), "{log}");
    assert!(requests.iter().any(|l| l["fields"]["status"] == json!(401) && l["fields"]["route"] == "/"), "{log}");
    let lower = log.to_ascii_lowercase();
    for t in [&front.token, &front.readonly_token] {
        // (Its first 16 characters: the log cuts a command's name at 32.)
        assert!(!lower.contains(&t.to_ascii_lowercase()[..16]), "a token in the log: {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redcount_serve_counts_requests_by_route_policy_and_status() {
    let mut redis = RedisServer::start();
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    let admin = secret("admin");
    let server = NativeServer::start_with(
        &[("REDIS_URL", &redis.url())],
        &admin,
        TEST_POLICIES,
        &["--metrics-listen", &listen, "--log-format", "json", "--timeout-ms", "1000"],
    );
    let base = server.url();
    // The same route and policy percent-encoded count under the same labels (routing decodes).
    for path in ["quotas/daily-prize", "quotas/daily-prize", "quot%61s/daily%2Dprize"] {
        assert_eq!(post(format!("{base}/api/{path}/alice"), None, "{}".into()).await.0, 200, "{path}");
    }
    assert_eq!(post(format!("{base}/api/quotas/no-such-policy/alice"), None, "{}".into()).await.0, 404);
    assert_eq!(post(format!("{base}/api/claims/signup-bonus/a"), None, "".into()).await.0, 200);
    // A decision counts under its own route (its subject is no label).
    let decision = r#"{"parts":[{"policy":"burst"}]}"#;
    assert_eq!(post(format!("{base}/api/decisions/alice"), None, decision.into()).await.0, 200);
    // A fresh Redis had none of the three scripts: three fallbacks so far. The script cache lost, the
    // next claim falls back to EVAL once more.
    let (_, m) = scrape(metrics).await;
    assert_eq!(value(&m, "redcount_noscript_fallbacks_total", &[]), 3.0);
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut redis.conn()).unwrap();
    assert_eq!(post(format!("{base}/api/claims/signup-bonus/b"), None, "".into()).await.0, 200);
    let (text, m) = scrape(metrics).await;
    let requests = "redcount_requests_total";
    let quota = [("route", "quotas"), ("policy", "daily-prize")];
    // A denied take is an answer too (200 with allowed: false).
    assert_eq!(value(&m, requests, &[quota[0], quota[1], ("status", "200")]), 3.0, "{text}");
    assert_eq!(value(&m, requests, &[("route", "quotas"), ("policy", "-"), ("status", "404")]), 1.0, "{text}");
    assert!(!text.contains("no-such-policy"), "a client's name became a label: {text}");
    assert_eq!(value(&m, requests, &[("route", "claims"), ("policy", "signup-bonus")]), 2.0, "{text}");
    assert_eq!(value(&m, "redcount_noscript_fallbacks_total", &[]), 4.0, "{text}");
    assert_eq!(value(&m, requests, &[("route", "decisions"), ("policy", "-"), ("status", "200")]), 1.0, "{text}");
    assert!(!text.contains("alice"), "a subject became a label: {text}");
    // Redis gone: the failed call is counted by what happened.
    redis.kill();
    let (status, _) = post(format!("{base}/api/claims/signup-bonus/c"), None, "".into()).await;
    assert!(status >= 500, "{status}");
    let (text, m) = scrape(metrics).await;
    let errors: f64 = m.iter().filter(|((n, _), _)| n == "redcount_backend_errors_total").map(|(_, v)| v).sum();
    assert!(errors >= 1.0, "{text}");
    let log = server.log();
    assert!(log.lines().filter(|l| !l.is_empty()).all(|l| serde_json::from_str::<Value>(l).is_ok()), "{log}");
    assert!(!log.contains(&admin) && !text.contains(&admin), "the admin token leaked");
}
