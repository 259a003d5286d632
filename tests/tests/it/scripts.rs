//! The script registry against a real script cache.

use redcount_core::ops::counter::{AddCounter, Bounds, Storage};
use redcount_core::{Command, Value};
use redcount_tests::{RedisServer, uid};

#[tokio::test]
async fn every_sha_equals_what_script_load_returns() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    for s in redcount_core::script::ALL {
        let sha = d.send(&Command::new("SCRIPT").arg("LOAD").arg(s.source())).await.unwrap();
        assert_eq!(sha, Value::Bytes(s.sha1().as_bytes().to_vec()), "{}", s.name());
    }
}

#[tokio::test]
async fn noscript_recovers_with_one_extra_round_trip() {
    let redis = RedisServer::start();
    let d = redis.direct().await;
    let subject = uid("s");
    let op = AddCounter::new("jobs", &subject, Storage::Key, 1, Bounds::default()).unwrap();
    d.run(&op).await.unwrap(); // EVALSHA fails, EVAL caches it
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (1, 1));
    d.run(&op).await.unwrap(); // cached now: EVALSHA only
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (2, 1));

    d.send(&Command::new("SCRIPT").arg("FLUSH")).await.unwrap();
    let out = d.run(&op).await.unwrap();
    assert_eq!(out.value, 3, "the write after the flush happened exactly once");
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (3, 2), "one EVAL after the flush");
    d.run(&op).await.unwrap();
    assert_eq!((redis.calls("evalsha"), redis.calls("eval")), (4, 2));
}
