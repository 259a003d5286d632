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
