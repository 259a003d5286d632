//! `redcount drain`'s store against a real redis-server, in-process: a red-packet id that
//! comes back (a create retried under its `Idempotency-Key` once the first packet, its grab
//! log and the key's record expired) is a new packet, and its grabs are all copied, apart from
//! the first packet's.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use redcount_cli::drain::{Store, drain_packet};
use redcount_cli::serve::{Backend, app};
use redcount_core::keys::Namespace;
use serde_json::Value;
use tower::ServiceExt;

mod support;
use support::server;

async fn post(app: &axum::Router, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let mut r = Request::post(path);
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    let response = app.clone().oneshot(r.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The same id made twice: the second packet's five grabs (two by users of the first) are
/// copied whole beside the first's three. (Before: its cursor stood at the first log's
/// length, so its first three grabs were never copied.)
#[tokio::test]
async fn a_packet_id_made_again_after_the_first_expired_is_copied_whole() {
    let server = server();
    let policies =
        r#"{"packets": {"kind": "redpackets", "max_shares": 10, "max_total_cents": 5000, "ttl_ms": 3600000}}"#;
    let config = redcount_api::Config::from_env(|name| match name {
        "REDCOUNT_POLICIES" => Some(policies.to_string()),
        "REDCOUNT_ADMIN_TOKEN" => Some("admin-token-of-drain-store-0123".to_string()),
        _ => None,
    })
    .unwrap();
    let direct = redcount::Direct::connect(&server.url).await.unwrap();
    let app = app(config, Backend::Direct(direct.clone()), std::env::temp_dir(), Duration::from_secs(5));
    let dir = redcount_procs::scratch_dir("drain-store");
    let ns = Namespace::default();
    let mut store = Store::open(&dir.join("claims.db"), &ns).unwrap();
    let make = || post(&app, "/api/redpackets", r#"{"total_cents":1000,"count":8}"#, Some("the-same-key"));

    let (status, made) = make().await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    for user in ["a", "b", "c"] {
        assert_eq!(
            post(&app, &format!("/api/redpackets/{id}/grab"), &format!(r#"{{"user":"{user}"}}"#), None).await.0,
            200
        );
    }
    assert_eq!(drain_packet(&direct, &ns, &mut store, &id, 100).await.unwrap(), 3);
    assert_eq!(store.totals(&id).unwrap().0, 3);

    // Everything of the first packet expires (its keys and the Idempotency-Key's record).
    let mut c = redis::Client::open(server.url.as_str()).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let (status, again) = make().await;
    assert_eq!((status, again["id"].as_str()), (201, Some(id.as_str())), "the same key makes the same id: {again}");
    let mut second = 0;
    for user in ["a", "b", "d", "e", "f"] {
        let (s, g) = post(&app, &format!("/api/redpackets/{id}/grab"), &format!(r#"{{"user":"{user}"}}"#), None).await;
        assert_eq!((s, &g["outcome"]), (200, &Value::from("won")), "{g}");
        second += g["amount"].as_i64().unwrap();
    }
    assert_eq!(drain_packet(&direct, &ns, &mut store, &id, 100).await.unwrap(), 5, "every grab of the second packet");
    assert_eq!(drain_packet(&direct, &ns, &mut store, &id, 100).await.unwrap(), 0, "and once");
    assert_eq!(store.totals(&id).unwrap().0, 3, "the first packet's grabs stay its own");
    let generations = store.generations(&id).unwrap();
    assert_eq!(generations.len(), 2, "{generations:?}");
    let (name, count, sum) = &generations[1];
    assert!(name.starts_with(&format!("{id}@")), "{name}");
    assert_eq!((*count, *sum), (5, second));
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
