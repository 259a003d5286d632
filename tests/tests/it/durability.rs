//! Writes of money acknowledged only once a replica has them (`--wait-replicas`, for
//! `redcount serve --redis` / `--cluster` and for the REST front): with the replica paused, such a
//! call answers "not durable" within its wait, never a silent success; and across a master
//! paused past its failover, no call is answered 200 whose write is then lost on demotion.

use std::time::{Duration, Instant};

use redcount::Direct;
use redcount::direct::ReplicaWait;
use redcount_core::keys;
use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_tests::{Api, Front, NativeServer, RedisCluster, RedisServer, Stopped, TEST_POLICIES, secret};
use serde_json::{Value, json};

const WAIT_MS: u64 = 400;

/// A replica of `master`, in sync.
fn replica_of(master: &RedisServer) -> RedisServer {
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut replica.conn()).unwrap();
        if info.contains("master_link_status:up") {
            return replica;
        }
        assert!(Instant::now() < deadline, "the replica did not sync:\n{info}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts a 503 that says the call is not known durable, answered after its wait and well
/// within the call's limit.
fn assert_not_durable(what: &str, status: u16, body: &Value, took: Duration) {
    assert_eq!(status, 503, "{what} with the replica paused: {body}");
    assert_eq!((&body["durable"], &body["may_have_run"]), (&json!(false), &json!(true)), "{what}: {body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("0 of 1 replica")), "{what} says why: {body}");
    assert!(
        took >= Duration::from_millis(WAIT_MS) && took < Duration::from_millis(WAIT_MS + 2_000),
        "{what} took {took:?} for a wait of {WAIT_MS} ms"
    );
}

/// One Redis and its replica: `serve --redis`, the front, and `serve --rest-url` through that
/// front answer counter adds and red-packet grabs once the replica has them; with the replica
/// paused (SIGSTOP: connected, acknowledging nothing) each such write answers 503 `"durable":
/// false` after the wait (the write is on the master), while reads and quota takes (not money)
/// are served; with the replica back, 200 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_money_wait_for_a_replica_or_say_they_are_not_durable() {
    let master = RedisServer::start();
    let replica = replica_of(&master);
    let wait = ["--wait-replicas", "1", "--wait-replicas-ms", "400"];
    let admin = secret("admin");
    let direct = NativeServer::start_with(&[("REDIS_URL", &master.url())], &admin, TEST_POLICIES, &wait);
    let front = Front::start_with(&master.url(), false, &wait);
    let via_front = NativeServer::start(
        &[("REDCOUNT_REST_URL", &front.url()), ("REDCOUNT_REST_TOKEN", &front.token)],
        &admin,
        TEST_POLICIES,
    );
    // Each shell's name is also the subject of its counter.
    let shells = [("direct", Api::new(direct.url(), &admin)), ("via-front", Api::new(via_front.url(), &admin))];
    let value = |subject: &str| -> Option<i64> {
        redis::cmd("HGET").arg(keys::counter_hash("running-jobs")).arg(subject).query(&mut master.conn()).unwrap()
    };
    let mut packets = Vec::new();
    for (what, api) in &shells {
        let (status, c) = api.post(&format!("/api/counters/running-jobs/{what}"), r#"{"delta":1}"#).await.parts();
        assert_eq!((status, &c["value"]), (200, &json!(1)), "{what}: {c}");
        let (status, made) = api.post("/api/redpackets", r#"{"total_cents":1000,"count":10}"#).await.parts();
        assert_eq!(status, 201, "{what}: {made}");
        let id = made["id"].as_str().unwrap().to_string();
        let (status, g) = api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u1"}"#).await.parts();
        assert_eq!((status, &g["outcome"]), (200, &json!("won")), "{what}: {g}");
        packets.push(id);
    }

    let paused = Stopped::stop(replica.pid());
    for ((what, api), id) in shells.iter().zip(&packets) {
        let started = Instant::now();
        let (status, c) = api.post(&format!("/api/counters/running-jobs/{what}"), r#"{"delta":1}"#).await.parts();
        assert_not_durable(&format!("{what}: a counter add"), status, &c, started.elapsed());
        assert_eq!(value(what), Some(2), "{what}: the add happened on the master");
        let started = Instant::now();
        let (status, g) = api.post(&format!("/api/redpackets/{id}/grab"), r#"{"user":"u2"}"#).await.parts();
        assert_not_durable(&format!("{what}: a grab"), status, &g, started.elapsed());
        let started = Instant::now();
        let (status, made) = api.post("/api/redpackets", r#"{"total_cents":500,"count":5}"#).await.parts();
        assert_not_durable(&format!("{what}: a packet's creation"), status, &made, started.elapsed());
        // Reads and what is not money are not held to the replica.
        let (status, c) = api.get(&format!("/api/counters/running-jobs/{what}")).await.parts();
        assert_eq!((status, &c["value"]), (200, &json!(2)), "{what}: a read: {c}");
        let (status, q) = api.post(&format!("/api/quotas/daily-prize/{what}"), "").await.parts();
        assert_eq!((status, &q["allowed"]), (200, &json!(true)), "{what}: a quota take: {q}");
    }
    // The front itself, to any client: the same distinct 503.
    let rest = redcount::Rest::new(&front.url(), &front.token, Duration::from_secs(10)).unwrap();
    let add = AddCounter::new("direct", "front", Storage::Key, 1, Bounds::default()).unwrap();
    match rest.run(&add).await {
        Err(redcount::Error::Transport(t)) => {
            assert!(t.may_have_run && t.detail.contains("not known durable"), "{t:?}")
        }
        other => panic!("a counter add through the front with the replica paused answered {other:?}"),
    }
    drop(paused);
    for (what, api) in &shells {
        let (status, c) = api.post(&format!("/api/counters/running-jobs/{what}"), r#"{"delta":1}"#).await.parts();
        assert_eq!((status, &c["value"]), (200, &json!(3)), "{what} with the replica back: {c}");
    }
    let replicated: Option<i64> =
        redis::cmd("HGET").arg(keys::counter_hash("running-jobs")).arg("direct").query(&mut replica.conn()).unwrap();
    assert_eq!(replicated, Some(3), "the replica has every add");
}

/// The index of the node that replicates node `master`.
fn replica_index(cluster: &RedisCluster, master: usize) -> usize {
    let id = cluster.node_id(master);
    (0..cluster.nodes.len())
        .find(|&i| {
            let info: String = redis::cmd("CLUSTER").arg("NODES").query(&mut cluster.nodes[i].conn()).unwrap();
            info.lines().any(|l| l.contains("myself") && l.contains("slave") && l.contains(&id))
        })
        .expect("a replica of the master")
}

/// The index of the master that serves `slot`, as node `view` sees it (`ids`: the nodes' ids,
/// read before any was paused).
fn master_of(cluster: &RedisCluster, ids: &[String], view: usize, slot: i64) -> usize {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut cluster.nodes[view].conn()).unwrap();
    let owner = nodes
        .lines()
        .find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let serves = f.iter().skip(8).filter(|r| !r.starts_with('[')).any(|r| {
                let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                (lo.parse::<i64>().unwrap()..=hi.parse::<i64>().unwrap()).contains(&slot)
            });
            (f[2].contains("master") && serves).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| panic!("no master serves slot {slot}:\n{nodes}"));
    ids.iter().position(|id| *id == owner).unwrap()
}

/// On a Cluster with replicas, through `Direct` (as `serve --cluster` runs it) and through the
/// front on the Cluster: with the replica of the counter's master paused, an add answers not
/// durable. Then a failover's loss: the master itself paused, adds queued for it,
/// its replica promoted, the old master let go on: writes it acknowledged then were lost when
/// it learned it had been demoted. With the wait none is answered as done unless the Cluster
/// keeps it: every add answered OK is in the counter at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_no_write_of_money_is_acknowledged_and_then_lost_at_a_failover() {
    let cluster = RedisCluster::start_with_replicas(3);
    let seeds = cluster.urls();
    let limit = Duration::from_secs(20);
    let wait = ReplicaWait { replicas: 1, timeout: Duration::from_millis(WAIT_MS) };
    let d = Direct::connect_waiting(&seeds, true, limit, wait).await.unwrap();
    let front = Front::start_with(
        &seeds,
        true,
        &["--timeout-ms", "20000", "--wait-replicas", "1", "--wait-replicas-ms", &WAIT_MS.to_string()],
    );
    let rest = redcount::Rest::new(&front.url(), &front.token, Duration::from_secs(30)).unwrap();
    let add = |s: &str| AddCounter::new("durable", s, Storage::Key, 1, Bounds::default()).unwrap();
    let key = |s: &str| keys::counter("durable", s);
    let ids: Vec<String> = (0..cluster.nodes.len()).map(|i| cluster.node_id(i)).collect();
    let slot_of = |s: &str| -> i64 {
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key(s)).query(&mut cluster.nodes[0].conn()).unwrap()
    };
    let native = "native";
    let m = master_of(&cluster, &ids, 0, slot_of(native));
    // The front's subject on the same master.
    let through_front = (0..).map(|i| format!("f{i}")).find(|s| master_of(&cluster, &ids, 0, slot_of(s)) == m).unwrap();
    let through_front = through_front.as_str();
    assert_eq!(d.run(&add(native)).await.unwrap().value, 1);
    assert_eq!(rest.run(&add(through_front)).await.unwrap().value, 1);

    // The replica paused: not durable, within the wait.
    let paused = Stopped::stop(cluster.nodes[replica_index(&cluster, m)].pid());
    let started = Instant::now();
    match d.run(&add(native)).await {
        Err(redcount::Error::NotDurable(why)) => assert!(why.contains("0 of 1 replica"), "{why}"),
        other => panic!("an add with the replica paused answered {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_millis(WAIT_MS + 2_000), "took {:?}", started.elapsed());
    match rest.run(&add(through_front)).await {
        Err(redcount::Error::Transport(t)) => assert!(t.detail.contains("not known durable"), "{t:?}"),
        other => panic!("an add through the front with the replica paused answered {other:?}"),
    }
    drop(paused);
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.run(&add(native)).await.is_err() {
        assert!(Instant::now() < deadline, "adds still not durable 20 s after the replica went on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The master paused past its failover, with adds queued for it. (Nothing asks the paused
    // node: it would not answer.)
    let (mut acked, mut maybe) = (0i64, 0i64);
    let before: i64 = redis::cmd("GET").arg(key(native)).query(&mut cluster.conn()).unwrap();
    let slot = slot_of(native);
    let old = master_of(&cluster, &ids, 0, slot);
    let stopped = Stopped::stop(cluster.nodes[old].pid());
    let d = std::sync::Arc::new(d);
    let queued: Vec<_> = (0..6)
        .map(|_| {
            let d = d.clone();
            tokio::spawn(async move { d.run(&add(native)).await })
        })
        .collect();
    let other = (0..cluster.nodes.len()).find(|&i| i != old).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while master_of(&cluster, &ids, other, slot) == old {
        assert!(Instant::now() < deadline, "no failover 30 s after the master was paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stopped);
    for q in queued {
        match q.await.unwrap() {
            Ok(_) => acked += 1,
            Err(redcount::Error::Redis(e)) => panic!("an add answered a Redis error: {e}"),
            Err(e) => {
                println!("an add queued for the paused master: {e}");
                maybe += 1;
            }
        }
    }
    // The old master has learnt it is a replica now, and synced from the new one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut cluster.nodes[old].conn()).unwrap();
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            break;
        }
        assert!(Instant::now() < deadline, "the old master did not become a replica:\n{info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after: i64 = redis::cmd("GET").arg(key(native)).query(&mut cluster.conn()).unwrap();
    println!("queued adds: {acked} acknowledged, {maybe} not (counter {before} -> {after})");
    assert!(after - before >= acked, "{acked} adds were acknowledged but the counter went from {before} to {after}");
    assert!(after - before <= acked + maybe, "more adds applied than were sent");
}
