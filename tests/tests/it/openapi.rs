//! Property-based testing of the HTTP API from its OpenAPI document: schemathesis (from
//! PyPI, in a venv `cargo xtask setup` makes under the target dir) generates requests for
//! every operation of the committed `openapi.json` and sends them to `redcount serve` on a
//! real redis-server, with policies of every kind and the admin token; every answer must
//! match its documented schema, status and headers, and none may be a 5xx.
//!
//! The document is the committed one, with each `policy` narrowed to the names this
//! deployment configures of the kind the route takes (as a deployment's own copy would be),
//! so the cases reach the operations rather than stopping at "no policy named".
//!
//! Seeded: `REDCOUNT_SEED` replays a run (the seed is printed, with the number of cases, to
//! stderr and to `target/schemathesis/summary.txt`, which `cargo xtask test` prints).

use std::path::PathBuf;
use std::process::Command;

use redcount_tests::{NativeServer, RedisServer, root, secret};
use serde_json::{Value, json};

const POLICIES: &str = r#"{
  "fixed":   {"kind": "quota", "algorithm": "fixed", "limit": 50, "window_ms": 60000, "max_cost": 5},
  "sliding": {"kind": "quota", "algorithm": "sliding", "limit": 50, "window_ms": 60000},
  "bucket":  {"kind": "quota", "algorithm": "bucket", "capacity": 20, "refill": 2, "interval_ms": 1000},
  "gcra":    {"kind": "quota", "algorithm": "gcra", "rate": 10, "period_ms": 1000, "burst": 20},
  "slots":   {"kind": "semaphore", "limit": 3, "lease_ms": 60000},
  "steps":   {"kind": "counter", "min": -1000, "max": 1000, "max_step": 10},
  "seats":   {"kind": "counter", "min": 0, "max": 5, "mode": "reject", "storage": "hash"},
  "bonus":   {"kind": "claim", "window_ms": 60000},
  "packets": {"kind": "redpackets", "max_shares": 50, "max_total_cents": 100000, "ttl_ms": 600000},
  "mail":    {"kind": "inbox", "max_len": 20, "max_age_s": 60}
}"#;

/// Where `cargo xtask setup` installs schemathesis.
fn schemathesis() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    target.join("schemathesis/bin/schemathesis")
}

/// The configured policies' names of each kind.
fn names(kind: &[&str]) -> Value {
    let policies: Value = serde_json::from_str(POLICIES).unwrap();
    let list: Vec<&String> = policies
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, p)| kind.contains(&p["kind"].as_str().unwrap()))
        .map(|(n, _)| n)
        .collect();
    json!({"type": "string", "enum": list})
}

/// The committed document, each `policy` narrowed to this deployment's names of its kind.
fn specialised() -> Value {
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(root().join("openapi.json")).unwrap()).unwrap();
    for (path, item) in doc["paths"].as_object_mut().unwrap() {
        let kind: &[&str] = match path.split('/').nth(2).unwrap_or("") {
            "counters" => &["counter"],
            "claims" => &["claim"],
            "quotas" => &["quota"],
            "overrides" => &["quota", "semaphore"],
            "semaphores" => &["semaphore"],
            _ => &[],
        };
        for op in item.as_object_mut().unwrap().values_mut() {
            // `pointer_mut`, not indexing: indexing a missing key would add it, as null.
            for p in op.pointer_mut("/parameters").and_then(Value::as_array_mut).into_iter().flatten() {
                if p["name"] == "policy" && p["in"] == "path" {
                    p["schema"] = names(kind);
                }
            }
            let Some(body) = op.pointer_mut("/requestBody/content/application~1json/schema") else { continue };
            if let Some(policy) = body.pointer_mut("/properties/policy") {
                *policy = names(&["redpackets"]);
            }
            if let Some([quota, lease]) =
                body.pointer_mut("/properties/parts/items/oneOf").and_then(Value::as_array_mut).map(Vec::as_mut_slice)
            {
                quota["properties"]["policy"] = names(&["quota"]);
                lease["properties"]["policy"] = names(&["semaphore"]);
            }
        }
    }
    doc
}

#[test]
fn every_answer_matches_the_document() {
    let bin = schemathesis();
    assert!(bin.exists(), "{} is missing: run `cargo xtask setup` (it installs schemathesis)", bin.display());
    let redis = RedisServer::start();
    let admin = secret("admin");
    let server = NativeServer::start(&[("REDIS_URL", &redis.url())], &admin, POLICIES);
    let dir = redcount_procs::scratch_dir("schemathesis");
    let schema = dir.join("openapi.json");
    std::fs::write(&schema, serde_json::to_string_pretty(&specialised()).unwrap()).unwrap();
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_127);
    let examples = std::env::var("REDCOUNT_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "50".into());
    eprintln!(
        "schemathesis: seed {seed} (replay: REDCOUNT_SEED={seed} cargo test -p redcount-tests --test it openapi)"
    );
    let out = Command::new(&bin)
        .current_dir(&dir)
        .arg("run")
        .arg(&schema)
        .args(["--url", &server.url()])
        .args(["--header", &format!("Authorization: Bearer {admin}")])
        .args(["--seed", &seed.to_string(), "--max-examples", &examples, "--workers", "1"])
        .args(["--phases", "examples,coverage,fuzzing", "--generation-database", "none"])
        // Valid per the document is not always valid per the policies (a cost above a
        // policy's limit, a packet below its minimum share): the 400 is right there.
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["--request-timeout", "10", "--no-color", "--output-sanitize", "true"])
        // Requests that are not HTTP (see openapi_hooks.py) are left out.
        .env("PYTHONPATH", root().join("tests/tests/it"))
        .env("SCHEMATHESIS_HOOKS", "openapi_hooks")
        .output()
        .expect("schemathesis runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let cases = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains(" generated"))
        .unwrap_or("no case count found");
    let summary = format!("API fuzzing (schemathesis, seed {seed}): {cases}\n");
    eprint!("{summary}");
    let dir = bin.parent().unwrap().parent().unwrap();
    let _ = std::fs::write(dir.join("summary.txt"), &summary);
    let _ = std::fs::write(dir.join("last-run.log"), &text);
    assert!(!text.contains(&admin), "the admin token in schemathesis's output");
    assert!(out.status.success(), "schemathesis found failures (seed {seed}):\n{text}\nserve's log:\n{}", server.log());
}
