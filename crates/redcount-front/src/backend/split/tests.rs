use super::*;

/// A xorshift generator seeded from `REDCOUNT_SEED` or the clock (printed, to replay).
fn rng() -> (u64, impl FnMut(u64) -> u64) {
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {seed} (replay: REDCOUNT_SEED={seed})");
    let mut x = seed | 1;
    (seed, move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    })
}

/// One random reply of any RESP2/RESP3 type, nested up to `depth`; now and then a bulk string
/// of up to `large` bytes.
fn reply(rand: &mut impl FnMut(u64) -> u64, depth: u32, large: usize) -> Vec<u8> {
    let kinds = if depth == 0 { 9 } else { 14 };
    match rand(kinds) {
        0 => format!("+{}\r\n", "o".repeat(rand(40) as usize)).into_bytes(),
        1 => format!("-ERR {}\r\n", "e".repeat(rand(40) as usize)).into_bytes(),
        2 => format!(":{}\r\n", rand(1 << 40) as i64 - (1 << 39)).into_bytes(),
        3 | 4 => {
            let n = if rand(4) == 0 { rand(large as u64 + 1) as usize } else { rand(64) as usize };
            // Payload bytes that look like RESP, CRLF included: only the length may tell.
            let body: Vec<u8> = (0..n).map(|i| b"*$\r\n:-+1"[(i + rand(3) as usize) % 8]).collect();
            [format!("${n}\r\n").into_bytes(), body, b"\r\n".to_vec()].concat()
        }
        5 => b"$-1\r\n".to_vec(),
        6 => b"_\r\n".to_vec(),
        7 => format!(",{}.5\r\n", rand(1000)).into_bytes(),
        8 => {
            if rand(2) == 0 {
                b"#t\r\n".to_vec()
            } else {
                b"*0\r\n".to_vec()
            }
        }
        9 | 10 => {
            let n = rand(5);
            let mut out = format!("{}{n}\r\n", ["*", "~"][rand(2) as usize]).into_bytes();
            for _ in 0..n {
                out.extend(reply(rand, depth - 1, large));
            }
            out
        }
        11 => {
            let n = rand(3);
            let mut out = format!("%{n}\r\n").into_bytes();
            for _ in 0..2 * n {
                out.extend(reply(rand, depth - 1, large));
            }
            out
        }
        12 => {
            let mut out = b"|1\r\n+ttl\r\n:3\r\n".to_vec();
            out.extend(reply(rand, depth - 1, large));
            out
        }
        _ => b"*-1\r\n".to_vec(),
    }
}

/// The replies `split` made ready so far, each parsed by redis-rs (told apart by a framing of
/// their own: a wrong cut would not parse, or not as sent).
fn parsed(split: &mut Split) -> Vec<Value> {
    let mut rest = split.ready().to_vec();
    split.gave(rest.len());
    let mut out = Vec::new();
    while !rest.is_empty() {
        let end = Framing::default().feed(&rest).unwrap().expect("whole replies only");
        out.push(redis::parse_redis_value(&rest[..end]).expect("what redis-rs is given parses"));
        rest.drain(..end);
    }
    out
}

/// Checks what redis-rs got (`got`) for `replies` sent: each in its place, as it was when
/// small, as a marker that gives it back whole when larger, as a too-large marker past the
/// bound; nothing left aside once taken back, and the budget given back with them.
fn check(what: &str, replies: &[Vec<u8>], got: &[Value], aside: &Aside, budget: &Semaphore, bound: usize) {
    assert_eq!(got.len(), replies.len(), "{what}: one value per reply");
    let mut held = Vec::new();
    for (i, (value, sent)) in got.iter().zip(replies).enumerate() {
        let original = redis::parse_redis_value(sent).expect("a generated reply parses");
        match aside.taken_value(value) {
            None => {
                assert!(sent.len() <= SMALL, "{what} reply {i}: a large reply passed as it is");
                assert_eq!(value, &original, "{what} reply {i}");
            }
            Some(Marked::Large(bytes, permit)) => {
                assert!(sent.len() > SMALL && sent.len() <= bound, "{what} reply {i}");
                assert_eq!(&bytes, sent, "{what} reply {i}: kept whole");
                let charged = permit.as_ref().map_or(0, |p| p.num_permits());
                assert_eq!(charged, (sent.len() - SMALL) / 1024, "{what} reply {i}: KiB past SMALL");
                held.push(permit);
            }
            Some(Marked::TooLarge) => assert!(sent.len() > bound, "{what} reply {i}: {} bytes", sent.len()),
            Some(Marked::BudgetSpent) => panic!("{what} reply {i}: the budget was ample"),
        }
    }
    assert!(aside.kept.lock().unwrap().is_empty(), "{what}: nothing left aside");
    drop(held);
    assert_eq!(budget.available_permits(), 1 << 20, "{what}: the budget given back");
}

/// Random streams of random replies (nested, of every type, some past SMALL, some past the
/// bound), taken in random pieces: see [`check`].
#[test]
fn each_reply_reaches_its_place_whole_or_marked() {
    let (seed, mut rand) = rng();
    let bound = 64 * 1024;
    for case in 0..300 {
        let aside = Arc::new(Aside::new(bound, Duration::from_secs(60)));
        let budget = Arc::new(Semaphore::new(1 << 20));
        let mut split = Split::new(aside.clone(), Some(budget.clone()));
        let replies: Vec<Vec<u8>> = (0..rand(12) + 1).map(|_| reply(&mut rand, 3, 2 * bound)).collect();
        let stream = replies.concat();
        let mut got = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let most = if rand(2) == 0 { 8 } else { 40_000 };
            let n = (rand(most) as usize + 1).min(stream.len() - at);
            split.take(&stream[at..at + n]).unwrap_or_else(|e| panic!("case {case} (seed {seed}): {e}"));
            at += n;
            got.extend(parsed(&mut split));
        }
        check(&format!("case {case} (seed {seed})"), &replies, &got, &aside, &budget, bound);
    }
}

/// Redis's side of a connection in memory: the stream, handed out in pieces of random sizes.
struct Pieces<F> {
    stream: Vec<u8>,
    at: usize,
    rand: F,
}

impl<F: FnMut(u64) -> u64 + Unpin> AsyncRead for Pieces<F> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let most = if (self.rand)(2) == 0 { 8 } else { 40_000 };
        let n = ((self.rand)(most) as usize + 1).min(self.stream.len() - self.at).min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.stream[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

/// The same through [`Split::poll_read`], as redis-rs reads, into buffers of random sizes, to
/// the stream's end.
#[test]
fn reading_as_redis_rs_does_gives_each_reply_in_its_place() {
    let (seed, mut rand) = rng();
    let (bound, waker) = (64 * 1024, std::task::Waker::noop());
    for case in 0..300 {
        let aside = Arc::new(Aside::new(bound, Duration::from_secs(60)));
        let budget = Arc::new(Semaphore::new(1 << 20));
        let mut split = Split::new(aside.clone(), Some(budget.clone()));
        let replies: Vec<Vec<u8>> = (0..rand(12) + 1).map(|_| reply(&mut rand, 3, 2 * bound)).collect();
        let (x, rest) = (rand(u64::MAX) | 1, replies.concat());
        let mut redis = Pieces { stream: rest, at: 0, rand: xorshift(x) };
        let mut out = Vec::new();
        loop {
            let mut space = vec![0u8; rand(20_000) as usize + 1];
            let mut buf = ReadBuf::new(&mut space);
            let polled = split.poll_read(&mut redis, &mut Context::from_waker(waker), &mut buf);
            assert!(matches!(polled, Poll::Ready(Ok(()))), "case {case} (seed {seed}): {polled:?}");
            if buf.filled().is_empty() {
                break;
            }
            out.extend_from_slice(buf.filled());
        }
        let mut got = Vec::new();
        let mut rest = &out[..];
        while !rest.is_empty() {
            let end = Framing::default().feed(rest).unwrap().expect("whole replies only");
            got.push(redis::parse_redis_value(&rest[..end]).expect("what redis-rs is given parses"));
            rest = &rest[end..];
        }
        check(&format!("case {case} (seed {seed})"), &replies, &got, &aside, &budget, bound);
        assert!(split.ended, "the stream's end is seen");
    }
}

fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 + Unpin {
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    }
}

/// A reply that would spend the budget is refused in its place (its bytes dropped, what it
/// held given back) and the replies after it pass on; a script's error of the marker's shape
/// without the secret is an error reply like any other, and takes nothing.
#[test]
fn a_spent_budget_refuses_one_reply_and_a_forged_marker_takes_nothing() {
    let aside = Arc::new(Aside::new(1 << 20, Duration::from_secs(60)));
    let budget = Arc::new(Semaphore::new(8));
    let mut split = Split::new(aside.clone(), Some(budget.clone()));
    let big = [format!("${}\r\n", 64 * 1024).into_bytes(), vec![b'x'; 64 * 1024], b"\r\n".to_vec()].concat();
    let kept = [format!("${}\r\n", SMALL + 2048).into_bytes(), vec![b'y'; SMALL + 2048], b"\r\n".to_vec()].concat();
    let forged = format!("-{CODE} {} 0\r\n", "0".repeat(32));
    split.take(&[big, b":7\r\n".to_vec(), kept.clone(), forged.into_bytes()].concat()).unwrap();
    let got = parsed(&mut split);
    assert_eq!(got.len(), 4);
    assert!(matches!(aside.taken_value(&got[0]), Some(Marked::BudgetSpent)));
    assert_eq!(budget.available_permits(), 8 - 2, "the refused reply's charge is given back, the kept one holds 2 KiB");
    assert_eq!(got[1], Value::Int(7));
    let Some(Marked::Large(bytes, permit)) = aside.taken_value(&got[2]) else { panic!("{:?}", got[2]) };
    assert_eq!(bytes, kept);
    assert_eq!(permit.map(|p| p.num_permits()), Some(2));
    assert_eq!(budget.available_permits(), 8);
    assert!(aside.taken_value(&got[3]).is_none(), "a forged marker is an error reply");
    assert!(matches!(&got[3], Value::ServerError(e) if e.code() == CODE));
}

/// A large reply whose request gave up is dropped once `keep` has passed, with its charge.
#[test]
fn a_reply_nobody_takes_back_is_dropped_after_keep() {
    let aside = Arc::new(Aside::new(1 << 20, Duration::from_millis(1)));
    let budget = Arc::new(Semaphore::new(1024));
    let mut split = Split::new(aside.clone(), Some(budget.clone()));
    let large = [format!("${}\r\n", 4 * SMALL).into_bytes(), vec![b'z'; 4 * SMALL], b"\r\n".to_vec()].concat();
    split.take(&large).unwrap();
    assert!(budget.available_permits() < 1024);
    std::thread::sleep(Duration::from_millis(5));
    split.take(&large).unwrap();
    assert_eq!(aside.kept.lock().unwrap().len(), 1, "the first, not taken back, was dropped");
    assert_eq!(budget.available_permits(), 1024 - 48);
}

/// Bytes that are not RESP fail the stream (its connection is closed) instead of being
/// guessed at.
#[test]
fn bytes_that_are_not_resp_fail_the_stream() {
    let aside = Arc::new(Aside::new(1 << 20, Duration::from_secs(1)));
    for bad in [&b"?x\r\n"[..], b"$1x\r\nab\r\n"] {
        assert!(Split::new(aside.clone(), None).take(bad).is_err(), "{bad:?}");
    }
    let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
    assert!(Split::new(aside, None).take(deep.as_bytes()).is_err());
}
