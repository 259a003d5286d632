//! The OpenAPI document: the committed `openapi.json` is what the route table generates
//! (regenerate it with `REDCOUNT_UPDATE_OPENAPI=1 cargo test -p redcount-api --test openapi`),
//! every route of the table is in it with every status the API can answer for it, and what
//! `GET /api/openapi.json` answers is that text.

use std::path::PathBuf;

use rand::SeedableRng;
use redcount_api::{self as api, ApiRequest, Config, ROUTES, Step};
use serde_json::Value;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../openapi.json")
}

#[test]
fn the_committed_document_is_what_the_route_table_generates() {
    let generated = api::openapi::document();
    let path = committed_path();
    if std::env::var_os("REDCOUNT_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi.json differs from what the route table generates: regenerate it with \
         `REDCOUNT_UPDATE_OPENAPI=1 cargo test -p redcount-api --test openapi` and commit it"
    );
}

#[test]
fn every_route_is_documented_with_its_parameters_and_errors() {
    let doc: Value = serde_json::from_str(api::openapi::document()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for spec in ROUTES {
        let op = &doc["paths"][spec.path][spec.method.to_ascii_lowercase()];
        assert!(op.is_object(), "{} {} is missing", spec.method, spec.path);
        let params: Vec<&str> = op["parameters"]
            .as_array()
            .map(|a| a.iter().filter(|p| p["in"] == "path").map(|p| p["name"].as_str().unwrap()).collect())
            .unwrap_or_default();
        assert_eq!(params, spec.params, "{}: path parameters", spec.path);
        for status in ["400", "401", "404", "413", "500", "502", "503"] {
            assert!(op["responses"][status].is_object(), "{} {}: {status} undocumented", spec.method, spec.path);
        }
        if spec.method != "GET" && !spec.path.ends_with("/grab") {
            let key = op["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "Idempotency-Key");
            assert!(key, "{} {}: a write takes an Idempotency-Key", spec.method, spec.path);
        }
    }
    let count: usize = doc["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(count, ROUTES.len(), "one operation per route, no other");
    assert_eq!(doc["components"]["securitySchemes"]["admin"]["scheme"], "bearer");
}

#[test]
fn the_api_serves_the_document() {
    let config = Config::from_env(|n| {
        (n == "REDCOUNT_POLICIES").then(|| r#"{"c": {"kind": "claim", "window_ms": 1000}}"#.to_string())
    })
    .unwrap();
    let req = ApiRequest {
        method: "GET",
        path: "/api/openapi.json",
        query: "",
        authorization: None,
        origin: None,
        idempotency_key: None,
        body: b"",
    };
    let Step::Respond(r) = api::handle(&config, &req, &mut rand::rngs::StdRng::seed_from_u64(1)) else { panic!() };
    assert_eq!(r.status, 200);
    assert_eq!(r.body, api::openapi::document());
}
