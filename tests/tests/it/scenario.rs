//! One pass over every primitive, run through any transport (RESP, REST, REST on a cluster).

use redcount::{Driver, Error};
use redcount_core::ErrorKind;
use redcount_core::ops::claim::Claim;
use redcount_core::ops::counter::{AddCounter, Bounds, CounterStatus, GetCounter, Storage};
use redcount_core::ops::inbox::{Append, Read, Trim};
use redcount_core::ops::quota::{Algorithm, ResetQuota, TakeQuota};
use redcount_core::ops::redpacket::{self, Create, Grab, GrabOutcome, ReadGrabs, ReadStatus};
use redcount_core::ops::semaphore::{Action, SemaphoreResult, UpdateLease};
use redcount_tests::uid;

pub async fn every_primitive<D: Driver>(d: &D) {
    let s = uid("s");
    // Counter, key and hash field.
    for storage in [Storage::Key, Storage::HashField] {
        let add = |n| AddCounter::new("jobs", &s, storage, n, Bounds::default()).unwrap();
        assert_eq!(d.run(&add(2)).await.unwrap().value, 2);
        let o = d.run(&add(-5)).await.unwrap();
        assert_eq!((o.value, o.applied, o.status), (0, -2, CounterStatus::Clamped));
        assert_eq!(d.run(&GetCounter::new("jobs", &s, storage).unwrap()).await.unwrap(), 0);
    }
    // Claim.
    let c = Claim::new("bonus", &s, 60_000).unwrap();
    assert!(d.run(&c).await.unwrap().claimed);
    assert!(!d.run(&c).await.unwrap().claimed);
    // Quotas.
    for algo in [
        Algorithm::FixedWindow { limit: 2, window_ms: 3_600_000 },
        Algorithm::SlidingWindow { limit: 2, window_ms: 3_600_000 },
        Algorithm::TokenBucket { capacity: 2, refill: 1, interval_ms: 3_600_000 },
    ] {
        let take = TakeQuota::take("daily", &s, algo, 1).unwrap();
        let got: Vec<bool> = [d.run(&take).await, d.run(&take).await, d.run(&take).await]
            .into_iter()
            .map(|r| r.unwrap().allowed)
            .collect();
        assert_eq!(got, [true, true, false], "{algo:?}");
        assert!(d.run(&ResetQuota::new("daily", &s, algo).unwrap()).await.unwrap());
        assert!(d.run(&TakeQuota::peek("daily", &s, algo, 2).unwrap()).await.unwrap().allowed);
    }
    // UpdateLease.
    let sem = |a, h: &str| UpdateLease::new("dev", &s, a, h, 1, 60_000).unwrap();
    assert_eq!(d.run(&sem(Action::Acquire, "a")).await.unwrap().result, SemaphoreResult::Acquired);
    assert_eq!(d.run(&sem(Action::Acquire, "b")).await.unwrap().result, SemaphoreResult::Full);
    assert_eq!(d.run(&sem(Action::Release, "a")).await.unwrap().result, SemaphoreResult::Released);
    // Inbox, including bytes that are not UTF-8 on the way back (the 4-byte stamp).
    for id in 1..=3 {
        d.run(&Append::new(&s, id, &format!("msg {id} ✓"), 60_000, 10).unwrap()).await.unwrap();
    }
    let page = d.run(&Read::new(&s, Some(1), 10).unwrap()).await.unwrap();
    assert_eq!(
        page.iter().map(|m| (m.id, m.body.clone())).collect::<Vec<_>>(),
        [(2, "msg 2 ✓".as_bytes().to_vec()), (3, "msg 3 ✓".as_bytes().to_vec())]
    );
    assert_eq!(d.run(&Trim::new(&s, 3600, 1, 10).unwrap()).await.unwrap().deleted, 2);
    // Red packet.
    let mut rng = rand::rng();
    let id = redpacket::new_id(&mut rng);
    d.run(&Create::new(&id, 1000, 3, 1, 60_000, &mut rng).unwrap()).await.unwrap();
    let mut sum = 0;
    for u in ["a", "b", "c"] {
        match d.run(&Grab::new(&id, u).unwrap()).await.unwrap() {
            GrabOutcome::Won { amount, .. } => sum += amount,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sum, 1000);
    assert_eq!(d.run(&Grab::new(&id, "d").unwrap()).await.unwrap(), GrabOutcome::Empty);
    assert!(matches!(d.run(&Grab::new(&id, "a").unwrap()).await.unwrap(), GrabOutcome::Already { .. }));
    let st = d.run(&ReadStatus::new(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!((st.grabbed, st.grabbed_sum), (3, 1000));
    assert_eq!(d.run(&ReadGrabs::new(&id, 0, 10).unwrap()).await.unwrap().len(), 3);
    // A typed error survives the transport.
    let bad = AddCounter::new("jobs", &s, Storage::Key, 1, Bounds::default()).unwrap();
    d.send(&redcount_core::Command::new("DEL").arg(redcount_core::keys::counter("jobs", &s))).await.unwrap();
    d.send(&redcount_core::Command::new("SADD").arg(redcount_core::keys::counter("jobs", &s)).arg("x")).await.unwrap();
    match d.run(&bad).await {
        Err(Error::Redis(e)) => assert_eq!(e.kind, ErrorKind::WrongType),
        other => panic!("{other:?}"),
    }
}

/// `n` users grab a `shares`-share packet at once through `d`: exactly min(n, shares) win,
/// the sum is the total, nobody wins twice.
pub async fn grab_storm<D: Driver + Clone + Send + 'static>(d: &D, n: usize, shares: i64) {
    use std::collections::HashSet;
    let mut rng = rand::rng();
    let id = redpacket::new_id(&mut rng);
    let total = 99_991;
    d.run(&Create::new(&id, total, shares, 1, 60_000, &mut rng).unwrap()).await.unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (d, id, barrier) = (d.clone(), id.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                (i, d.run(&Grab::new(&id, &format!("u{i}")).unwrap()).await.unwrap())
            })
        })
        .collect();
    let (mut winners, mut sum, mut empty) = (HashSet::new(), 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (i, GrabOutcome::Won { amount, .. }) => {
                assert!(winners.insert(i));
                sum += amount;
            }
            (_, GrabOutcome::Empty) => empty += 1,
            (_, other) => panic!("{other:?}"),
        }
    }
    let want = n.min(shares as usize);
    assert_eq!((winners.len(), empty), (want, n - want));
    if n >= shares as usize {
        assert_eq!(sum, total);
    }
    let st = d.run(&ReadStatus::new(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!(st.grabbed as usize, want);
    assert_eq!(st.grabbed_sum, sum);
}
