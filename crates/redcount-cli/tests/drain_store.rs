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

/// A redis-server, `redcount serve`'s app over it with one red-packet policy, and a scratch
/// directory for the store.
struct Setup {
    server: support::Server,
    direct: redcount::Direct,
    app: axum::Router,
    dir: std::path::PathBuf,
    ns: Namespace,
}

async fn setup() -> Setup {
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
    Setup { server, direct, app, dir: redcount_procs::scratch_dir("drain-store"), ns: Namespace::default() }
}

/// The same id made twice: the second packet's five grabs (two by users of the first) are
/// copied whole beside the first's three. (Before: its cursor stood at the first log's
/// length, so its first three grabs were never copied.)
#[tokio::test]
async fn a_packet_id_made_again_after_the_first_expired_is_copied_whole() {
    let Setup { server, direct, app, dir, ns } = setup().await;
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

/// Drain running beside an id made again and again (each packet grabbed by up to eight
/// users, then every key deleted and the same key making the id again), reading one record a
/// call: each name holds only grabs of the packet it names, no grab is stored twice, and the
/// last packet is stored whole. A packet deleted before drain read all its log loses the rest
/// (as one expired unread does). The seed is printed; `REDCOUNT_SEED` replays it. (Before: a
/// batch read while the id was made again went under the old packet's name, from its cursor.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_beside_an_id_made_again_stores_each_grab_under_its_own_packet_once() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (REDCOUNT_SEED={seed} to replay)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let Setup { server, direct, app, dir, ns } = setup().await;
    let store = Store::open(&dir.join("claims.db"), &ns).unwrap();
    let make = || post(&app, "/api/redpackets", r#"{"total_cents":1000,"count":8}"#, Some("made-again"));
    let (_, first) = make().await;
    let id = first["id"].as_str().unwrap().to_string();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drainer = {
        let (direct, ns, id, stop) = (direct.clone(), ns.clone(), id.clone(), stop.clone());
        tokio::spawn(async move {
            let mut store = store;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                drain_packet(&direct, &ns, &mut store, &id, 1).await.unwrap();
                tokio::task::yield_now().await;
            }
            store
        })
    };
    let mut c = redis::Client::open(server.url.as_str()).unwrap().get_connection().unwrap();
    // Each packet: its creation time and its grabs (user -> amount).
    let mut made: Vec<(i64, std::collections::BTreeMap<String, i64>)> = Vec::new();
    for g in 0..120 {
        if g > 0 {
            // A later millisecond (a packet is told from the one before by its creation
            // time), then the id made again at once, while drain may be reading.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
            assert_eq!(make().await.0, 201);
        }
        let status = app
            .clone()
            .oneshot(Request::get(format!("/api/redpackets/{id}")).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let bytes = axum::body::to_bytes(status.into_body(), usize::MAX).await.unwrap();
        let created = serde_json::from_slice::<Value>(&bytes).unwrap()["created_ms"].as_i64().unwrap();
        let mut grabs = std::collections::BTreeMap::new();
        for u in 0..rng.random_range(1..=8) {
            // Users of their own per packet: a grab stored under another packet's name is
            // seen (under a name that already holds that user, it would be dropped unseen).
            let user = format!("g{g}-u{u}");
            let (s, j) =
                post(&app, &format!("/api/redpackets/{id}/grab"), &format!(r#"{{"user":"{user}"}}"#), None).await;
            assert_eq!(s, 200, "{j}");
            if j["outcome"] == "won" {
                grabs.insert(user, j["amount"].as_i64().unwrap());
            }
        }
        made.push((created, grabs));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut store = drainer.await.unwrap();
    drain_packet(&direct, &ns, &mut store, &id, 1).await.unwrap();

    let mut stored = 0;
    for (name, born) in store.names(&id).unwrap() {
        let born = born.expect("every name has its packet's creation time");
        let (_, grabs) = made.iter().find(|(c, _)| *c == born).expect("a packet that was made");
        for (user, amount) in store.claims(&name).unwrap() {
            assert_eq!(
                grabs.get(&user),
                Some(&amount),
                "seed {seed}: {name} holds {user}'s {amount}, not that packet's"
            );
            stored += 1;
        }
    }
    let (last_created, last) = made.last().unwrap();
    let name = store.names(&id).unwrap().into_iter().find(|(_, b)| *b == Some(*last_created)).unwrap().0;
    assert_eq!(store.claims(&name).unwrap().len(), last.len(), "seed {seed}: the last packet whole");
    println!("{} packets, {} grabs made, {stored} stored", made.len(), made.iter().map(|m| m.1.len()).sum::<usize>());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
