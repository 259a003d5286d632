//! `redcount drain`: killed with SIGKILL at random points again and again, it still ends
//! with every claim in SQLite exactly once.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use redcount_core::keys;
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome};
use redcount_tests::{RedisServer, bin, scratch_dir};

/// packet -> user -> (amount, index), as Redis's claim logs hold them.
fn redis_claims(redis: &RedisServer, packets: &[String]) -> BTreeMap<(String, String), (i64, i64)> {
    let mut out = BTreeMap::new();
    for p in packets {
        let log: Vec<String> =
            redis::cmd("LRANGE").arg(&keys::redpacket(p)[3]).arg(0).arg(-1).query(&mut redis.conn()).unwrap();
        for rec in log {
            let f: Vec<&str> = rec.split(':').collect();
            out.insert((p.clone(), f[0].to_string()), (f[1].parse().unwrap(), f[2].parse().unwrap()));
        }
    }
    out
}

fn db_claims(db: &std::path::Path) -> BTreeMap<(String, String), (i64, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    // A drain killed before it created its table has stored nothing yet.
    let Ok(mut st) = conn.prepare("SELECT packet, user, amount, idx FROM claims") else {
        return BTreeMap::new();
    };
    let rows = st.query_map([], |r| Ok(((r.get(0)?, r.get(1)?), (r.get(2)?, r.get(3)?)))).unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_killed_at_random_points_loses_nothing_and_doubles_nothing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut rng = rand::rng();
    let mut packets = Vec::new();
    for _ in 0..3 {
        let id = redpacket::new_id(&mut rng);
        d.run(&Create::new(&id, 1_000_000, 2000, 1, 3_600_000, &mut rng).unwrap()).await.unwrap();
        packets.push(id);
    }
    // Every share claimed, from 8 connections at once.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let d = redis.direct().await;
        let packets = packets.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..6000).step_by(8) {
                let op = Grab::new(&packets[i % 3], &format!("user-{i}")).unwrap();
                assert!(matches!(d.run(&op).await.unwrap(), GrabOutcome::Won { .. }));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let want = redis_claims(&redis, &packets);
    assert_eq!(want.len(), 6000);

    let db = scratch_dir("drain").join("claims.sqlite");
    let run = || {
        Command::new(bin("redcount"))
            .args(["drain", "--redis", &redis.url(), "--batch", "5", "--db"])
            .arg(&db)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut interrupted, mut previous) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut child = run();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..60)));
        let finished = matches!(child.try_wait(), Ok(Some(s)) if s.success());
        if !finished {
            let _ = child.kill(); // SIGKILL: no cleanup of any kind
            let _ = child.wait();
            interrupted += 1;
        }
        // After every crash: no claim twice, none invented, progress never lost.
        let have = db_claims(&db);
        for (k, v) in &have {
            assert_eq!(want.get(k), Some(v), "a stored claim that Redis does not hold: {k:?}");
        }
        assert!(have.len() >= previous, "stored claims went backwards");
        previous = have.len();
        if finished || Instant::now() > deadline {
            break;
        }
    }
    assert!(interrupted >= 5, "only {interrupted} runs were killed mid-way: the test did not test crashes");
    // One clean run to finish whatever the last kill left.
    assert!(run().wait().unwrap().success());
    let have = db_claims(&db);
    assert_eq!(have, want, "SQLite holds exactly Redis's claims");
    let sum: i64 = have.values().map(|(a, _)| a).sum();
    assert_eq!(sum, 3 * 1_000_000);
    println!("drain was killed {interrupted} times mid-way; {} claims, each once", have.len());
}

/// Grabs of every share of `id` by users `{tag}-{i}`, from 8 connections at once.
async fn grab_all(redis: &RedisServer, id: &str, shares: usize, tag: &str) {
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (d, id, tag) = (redis.direct().await, id.to_string(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            for i in (t..shares).step_by(8) {
                let op = Grab::new(&id, &format!("{tag}-{i}")).unwrap();
                assert!(matches!(d.run(&op).await.unwrap(), GrabOutcome::Won { .. }));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A drain paused (SIGSTOP) in the middle of a packet's log while every key of the packet
/// goes and a packet of the same id is made and grabbed whole (what a create retried under
/// its `Idempotency-Key` a day later does), then let go and run again: the first packet's
/// grabs under its id and nothing else, the second's whole under `<id>@<created_ms>`, none
/// twice. (Before: the paused pass read the second log from the first one's cursor, storing
/// most of the second packet under the first's name, then all of it again under its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_paused_while_its_packet_id_is_made_again_misfiles_nothing() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let mut rng = rand::rng();
    let id = redpacket::new_id(&mut rng);
    let shares = 1500;
    d.run(&Create::new(&id, 1_000_000, shares as i64, 1, 3_600_000, &mut rng).unwrap()).await.unwrap();
    grab_all(&redis, &id, shares, "first").await;
    let first = redis_claims(&redis, std::slice::from_ref(&id));

    let db = scratch_dir("drain").join("claims.sqlite");
    let run = || {
        Command::new(bin("redcount"))
            .args(["drain", "--redis", &redis.url(), "--batch", "1", "--packet", &id, "--db"])
            .arg(&db)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut child = run();
    let deadline = Instant::now() + Duration::from_secs(30);
    while db_claims(&db).len() < 50 {
        assert!(Instant::now() < deadline, "drain stored under 50 grabs in 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    let paused = redcount_tests::Stopped::stop(child.id());
    let _: () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    d.run(&Create::new(&id, 1_000_000, shares as i64, 1, 3_600_000, &mut rng).unwrap()).await.unwrap();
    grab_all(&redis, &id, shares, "second").await;
    let second = redis_claims(&redis, std::slice::from_ref(&id));
    drop(paused);
    assert!(child.wait().unwrap().success());
    assert!(run().wait().unwrap().success());

    let have = db_claims(&db);
    let (mut under_id, mut under_new) = (0, 0);
    for ((name, user), v) in &have {
        if *name == id {
            assert_eq!(first.get(&(id.clone(), user.clone())), Some(v), "{user} under the first packet's id");
            under_id += 1;
        } else {
            assert!(name.starts_with(&format!("{id}@")), "{name}");
            assert_eq!(second.get(&(id.clone(), user.clone())), Some(v), "{user} under {name}");
            under_new += 1;
        }
    }
    assert_eq!(under_new, shares, "the second packet whole");
    println!("the first packet: {under_id} grabs stored before it went; the second: {under_new}");
}
