//! The plans against scripted outcomes and a virtual clock: each branch that takes a real
//! Redis (and some luck with timing) to reach, reached in memory.

use std::io;

use redis::Value;

use super::*;
use crate::backend::Failed;

const LIMIT: Duration = Duration::from_millis(1_000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Redis's error reply `text` as the failure the driver hands the plan.
fn reply(text: &str) -> Failure {
    let parsed = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply");
    let Value::ServerError(e) = parsed else { panic!("not an error reply: {text}") };
    failure::failure(&Failed::Redis(e.into()), LIMIT)
}

/// Redis's error reply `text` as a value (an entry's answer in a pipeline).
fn error_value(text: &str) -> Value {
    redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("an error reply")
}

fn timed_out() -> Failure {
    failure::timed_out(LIMIT)
}

fn lost() -> Failure {
    failure::failure(&Failed::Redis(io::Error::new(io::ErrorKind::ConnectionReset, "reset").into()), LIMIT)
}

fn ints(range: Range<usize>) -> Value {
    Value::Array(range.map(|i| Value::Int(i as i64)).collect())
}

// ---------------------------------------------------------------------------------------
// One command.

/// Runs a single command's plan against `replies` (one per send, in order), each taking
/// `cost` of the virtual clock. Returns the answer, what was sent, and when.
fn run_one(
    mut plan: One,
    t0: Instant,
    cost: Duration,
    replies: Vec<Outcome>,
) -> (Result<Value, Failure>, Vec<(Which, Duration)>) {
    let mut now = t0;
    let mut sent = Vec::new();
    let mut replies = replies.into_iter();
    let mut step = plan.start();
    loop {
        step = match step {
            Step::Send(which) => {
                sent.push((which, now - t0));
                now += cost;
                plan.next(now, replies.next().expect("a reply for every send"))
            }
            Step::Wait(until) => {
                assert!(until >= now, "waits only forward");
                now = until;
                plan.next(now, Outcome::Woke)
            }
            Step::Answer(a) => {
                assert!(replies.next().is_none(), "every scripted reply was used");
                return (a, sent);
            }
        };
    }
}

fn ok(v: Value) -> Outcome {
    Outcome::Answered(Ok(v), None)
}

fn err(f: Failure) -> Outcome {
    Outcome::Answered(Err(f), None)
}

#[test]
fn a_command_answered_at_once_is_its_answer() {
    let t0 = Instant::now();
    let (a, sent) = run_one(One::new(t0, LIMIT, false, false, None), t0, ms(1), vec![ok(Value::Int(7))]);
    assert_eq!(a.unwrap(), Value::Int(7));
    assert_eq!(sent, [(Which::Command, ms(0))]);
    let (a, _) = run_one(One::new(t0, LIMIT, false, false, None), t0, ms(1), vec![err(reply("WRONGTYPE no"))]);
    let f = a.unwrap_err();
    assert_eq!((f.status, f.cause), (StatusCode::BAD_REQUEST, Cause::Reply(ErrorKind::WrongType)));
    let (a, sent) = run_one(One::new(t0, LIMIT, false, true, None), t0, ms(1), vec![err(lost())]);
    assert_eq!(a.unwrap_err().cause, Cause::Lost, "a lost reply is never sent again");
    assert_eq!(sent.len(), 1);
}

#[test]
fn a_busy_or_loading_redis_is_waited_out_in_25_ms_steps_within_the_limit() {
    let t0 = Instant::now();
    // Busy all along: tries at 0, 25, 50, 75 ms; at 75 ms another 25 would reach the limit.
    let limit = ms(100);
    let busy = || err(reply("BUSY Redis is busy running a script"));
    let plan = One::new(t0, limit, false, false, None);
    let (a, sent) = run_one(plan, t0, Duration::ZERO, (0..4).map(|_| busy()).collect());
    let f = a.unwrap_err();
    assert_eq!((f.status, f.cause), (StatusCode::SERVICE_UNAVAILABLE, Cause::Reply(ErrorKind::Unavailable)));
    let at: Vec<Duration> = sent.iter().map(|(_, at)| *at).collect();
    assert_eq!(at, [ms(0), ms(25), ms(50), ms(75)]);
    // Loading, then served: the answer of the try that was served.
    let plan = One::new(t0, LIMIT, false, false, None);
    let loading = err(reply("LOADING Redis is loading the dataset in memory"));
    let (a, sent) = run_one(plan, t0, ms(2), vec![loading, ok(Value::Okay)]);
    assert_eq!(a.unwrap(), Value::Okay);
    assert_eq!(sent, [(Which::Command, ms(0)), (Which::Command, ms(27))]);
}

#[test]
fn redirects_are_followed_eight_times_with_growing_pauses() {
    let t0 = Instant::now();
    let moved = || err(reply("MOVED 3999 127.0.0.1:6381"));
    let plan = One::new(t0, ms(5_000), false, false, None);
    let (a, sent) = run_one(plan, t0, Duration::ZERO, (0..9).map(|_| moved()).collect());
    assert_eq!(a.unwrap_err().cause, Cause::Reply(ErrorKind::Redirect), "the ninth redirect is the answer");
    let at: Vec<u64> = sent.iter().map(|(_, at)| at.as_millis() as u64).collect();
    assert_eq!(at, [0, 15, 45, 90, 150, 225, 315, 420, 540], "15 ms more each time");
    // Within a short limit, fewer.
    let plan = One::new(t0, ms(100), false, false, None);
    let (_, sent) = run_one(plan, t0, Duration::ZERO, (0..4).map(|_| moved()).collect());
    assert_eq!(sent.len(), 4, "0, 15, 45, 90: a fifth would start at 150 ms");
}

#[test]
fn on_a_cluster_the_sender_waits_not_the_plan() {
    let t0 = Instant::now();
    for text in ["BUSY busy", "MOVED 1 127.0.0.1:7000", "TRYAGAIN keys split", "CLUSTERDOWN down"] {
        let (a, sent) = run_one(One::new(t0, LIMIT, true, false, None), t0, ms(1), vec![err(reply(text))]);
        assert!(a.is_err(), "{text}");
        assert_eq!(sent.len(), 1, "{text}: answered as Redis said it, not tried again");
    }
}

#[test]
fn a_rewritten_script_redis_lost_is_sent_again_once_as_its_source() {
    let t0 = Instant::now();
    let noscript = || err(reply("NOSCRIPT No matching script. Please use EVAL."));
    let (a, sent) = run_one(One::new(t0, LIMIT, false, true, None), t0, ms(3), vec![noscript(), ok(Value::Int(1))]);
    assert_eq!(a.unwrap(), Value::Int(1));
    assert_eq!(sent, [(Which::Command, ms(0)), (Which::Reload, ms(3))]);
    // Lost again right away: that is the answer, not a loop.
    let (a, sent) = run_one(One::new(t0, LIMIT, false, true, None), t0, ms(3), vec![noscript(), noscript()]);
    assert_eq!(a.unwrap_err().cause, Cause::Reply(ErrorKind::NoScript));
    assert_eq!(sent.len(), 2);
    // A script the front did not rewrite: the client's own fallback sends its source.
    let (a, sent) = run_one(One::new(t0, LIMIT, false, false, None), t0, ms(3), vec![noscript()]);
    assert_eq!(a.unwrap_err().cause, Cause::Reply(ErrorKind::NoScript));
    assert_eq!(sent.len(), 1);
}

#[test]
fn a_money_call_is_acknowledged_only_once_enough_replicas_have_it() {
    let t0 = Instant::now();
    let wait = ReplicaWait { replicas: 2, timeout: ms(250) };
    let waited = |acked: i64| Outcome::Answered(Ok(Value::Int(5)), Some(Value::Int(acked)));
    let (a, _) = run_one(One::new(t0, LIMIT, false, false, Some(wait)), t0, ms(1), vec![waited(2)]);
    assert_eq!(a.unwrap(), Value::Int(5));
    let (a, _) = run_one(One::new(t0, LIMIT, false, false, Some(wait)), t0, ms(1), vec![waited(1)]);
    let f = a.unwrap_err();
    assert_eq!((f.status, f.cause), (StatusCode::SERVICE_UNAVAILABLE, Cause::NotDurable));
    assert_eq!(
        f.message,
        "NOTDURABLE not known durable: the write happened on the master, but 1 of 2 replicas acknowledged it \
         within 250 ms: it may be lost if the master fails over (--wait-replicas)"
    );
    // An error reply wrote nothing: it is the answer, whatever WAIT said.
    let refused = Outcome::Answered(Err(reply("ERR redcount: over the limit")), Some(Value::Int(0)));
    let (a, _) = run_one(One::new(t0, LIMIT, false, false, Some(wait)), t0, ms(1), vec![refused]);
    assert_ne!(a.unwrap_err().cause, Cause::NotDurable);
}

// ---------------------------------------------------------------------------------------
// A pipeline or a transaction.

/// A scripted Redis for a batch: answers each step at a virtual time.
struct Script {
    t0: Instant,
    now: Instant,
    /// Every step the plan took, with when (from t0).
    log: Vec<(String, Duration)>,
}

impl Script {
    fn new() -> Self {
        let t0 = Instant::now();
        Script { t0, now: t0, log: Vec::new() }
    }

    /// Runs `plan`, answering each step with `answer(step, now)`, which also says how long it
    /// took.
    fn run(
        &mut self,
        mut plan: Batch,
        mut answer: impl FnMut(&Send, Duration) -> (BatchOutcome, Duration),
    ) -> Result<Vec<Value>, Failure> {
        let mut step = plan.start(self.now);
        for _ in 0..10_000 {
            step = match step {
                Step::Send(send) => {
                    self.log.push((format!("{send:?}"), self.now - self.t0));
                    let (outcome, took) = answer(&send, self.now - self.t0);
                    self.now += took;
                    plan.next(self.now, outcome)
                }
                Step::Wait(until) => {
                    assert!(until >= self.now);
                    self.log.push((format!("Wait({:?})", until - self.now), self.now - self.t0));
                    self.now = until;
                    plan.next(self.now, BatchOutcome::Woke)
                }
                Step::Answer(a) => return a,
            };
        }
        panic!("the plan did not end: {:?}", self.log.last());
    }

    fn sent(&self) -> Vec<&str> {
        self.log.iter().map(|(s, _)| s.as_str()).collect()
    }
}

fn batch(n: usize, atomic: bool, cluster: bool) -> impl FnOnce(Instant) -> Batch {
    move |t0| Batch::new(t0, n, atomic, cluster, LIMIT, 1 << 20, None)
}

#[test]
fn a_transaction_goes_at_once_and_an_empty_batch_answers_at_once() {
    let mut s = Script::new();
    let plan = batch(3, true, false)(s.now);
    let got = s.run(plan, |send, _| match send {
        Send::Chunk { range, .. } => (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(1)),
        other => panic!("{other:?}"),
    });
    assert_eq!(got.unwrap().len(), 3);
    assert_eq!(s.sent(), ["Chunk { range: 0..3, within: 1s }"]);
    let mut s = Script::new();
    let plan = batch(0, false, false)(s.now);
    assert!(s.run(plan, |send, _| panic!("{send:?}")).unwrap().is_empty());
}

#[test]
fn a_pipeline_starts_with_one_command_and_sizes_its_chunks_from_their_cost() {
    let mut s = Script::new();
    let plan = batch(100, false, false)(s.now);
    let mut sizes = Vec::new();
    let got = s.run(plan, |send, _| match send {
        Send::Chunk { range, .. } => {
            sizes.push(range.len());
            // 1 ms a command.
            (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(range.len() as u64))
        }
        other => panic!("{other:?}"),
    });
    let got = got.unwrap();
    assert_eq!(got, (0..100).map(|i| Value::Int(i as i64)).collect::<Vec<_>>(), "every reply, in order");
    assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 32, 5], "doubling from one, at most 32");
    // Dear commands: the next chunk fits what is left at the dearest rate.
    let mut s = Script::new();
    let plan = batch(100, false, false)(s.now);
    let mut sizes = Vec::new();
    let _ = s.run(plan, |send, _| match send {
        Send::Chunk { range, .. } => {
            sizes.push(range.len());
            // The first command is cheap, the rest cost 300 ms each.
            let cost = if range.start == 0 { 1 } else { 300 * range.len() as u64 };
            (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(cost))
        }
        other => panic!("{other:?}"),
    });
    assert_eq!(sizes, [1, 2, 1, 1], "after 601 ms at 300 ms a command, one at a time, until the limit");
}

#[test]
fn a_pipeline_past_the_limit_stops_and_says_what_ran() {
    let mut s = Script::new();
    let plan = batch(10, false, false)(s.now);
    let f = s
        .run(plan, |send, _| match send {
            Send::Chunk { range, .. } => (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(400)),
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!(f.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        f.message,
        "ERR the pipeline ran past --timeout-ms (1000 ms): Redis answered its first 3 of 10 commands (an error reply among them ran nothing), the rest were not sent"
    );
    // A chunk that got no answer in time may have run: said so, with how many were sent.
    let mut s = Script::new();
    let plan = batch(10, false, false)(s.now);
    let f = s
        .run(plan, |send, _| match send {
            Send::Chunk { range, within } if range.start == 0 => {
                assert_eq!(*within, LIMIT);
                (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(100))
            }
            Send::Chunk { within, .. } => {
                assert_eq!(*within, ms(900), "a chunk gets what is left of the request's time");
                (BatchOutcome::Chunk(Err(timed_out())), *within)
            }
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!(
        f.message,
        "ERR the pipeline ran past --timeout-ms (1000 ms): Redis answered its first 1 of 10 commands (an error reply among them ran nothing), the 2 sent after them may or may not have, the rest were not sent"
    );
    // A transaction's timeout is the plain one: it ran whole or not at all.
    let mut s = Script::new();
    let plan = batch(4, true, false)(s.now);
    let f = s.run(plan, |_, _| (BatchOutcome::Chunk(Err(timed_out())), LIMIT)).unwrap_err();
    assert_eq!(f.message, timed_out().message);
}

#[test]
fn a_chunk_refused_busy_or_loading_whole_is_sent_again() {
    for busy in [
        BatchOutcome::Chunk(Ok(Some(Value::Array(vec![error_value("BUSY x"), error_value("LOADING y")])))),
        BatchOutcome::Chunk(Err(reply("LOADING Redis is loading the dataset in memory"))),
    ] {
        let mut s = Script::new();
        let plan = Batch::new(s.now, 2, true, false, LIMIT, 1 << 20, None);
        let mut busy = Some(busy);
        let got = s.run(plan, |send, _| match (send, busy.take()) {
            (Send::Chunk { .. }, Some(b)) => (b, ms(2)),
            (Send::Chunk { range, .. }, None) => (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(2)),
            (other, _) => panic!("{other:?}"),
        });
        assert_eq!(got.unwrap().len(), 2);
        assert_eq!(
            s.sent(),
            ["Chunk { range: 0..2, within: 1s }", "Wait(25ms)", "Chunk { range: 0..2, within: 973ms }"]
        );
    }
    // Busy until the limit: then that is the answer.
    let mut s = Script::new();
    let plan = batch(2, true, false)(s.now);
    let f = s.run(plan, |_, _| (BatchOutcome::Chunk(Err(reply("BUSY busy"))), ms(5))).unwrap_err();
    assert_eq!(f.cause, Cause::Reply(ErrorKind::Unavailable));
    assert!(s.now - s.t0 >= LIMIT && s.now - s.t0 < LIMIT + ms(30), "{:?}", s.now - s.t0);
    // One entry busy among others that ran: the answer as it is.
    let mut s = Script::new();
    let plan = batch(2, true, false)(s.now);
    let mixed = Value::Array(vec![Value::Int(1), error_value("BUSY x")]);
    let got = s.run(plan, move |_, _| (BatchOutcome::Chunk(Ok(Some(mixed.clone()))), ms(1))).unwrap();
    assert_eq!(got.len(), 2);
}

#[test]
fn replies_past_the_bound_fail_the_request_whichever_way_they_came() {
    let big = Value::BulkString(vec![b'x'; 600]);
    for cluster in [false, true] {
        let mut s = Script::new();
        let plan = Batch::new(s.now, 3, false, cluster, LIMIT, 1_000, None);
        let big = big.clone();
        let f = s
            .run(plan, move |send, _| match send {
                Send::Chunk { range, .. } => {
                    (BatchOutcome::Chunk(Ok(Some(Value::Array(vec![big.clone(); range.len()])))), ms(1))
                }
                Send::Entry { .. } => (BatchOutcome::Entry(Ok(big.clone()), None), ms(1)),
                other => panic!("{other:?}"),
            })
            .unwrap_err();
        assert_eq!(f.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            f.message,
            "ERR reply larger than --max-response-bytes (1000 bytes): ask for less at once (fewer commands per pipeline)"
        );
        assert_eq!(s.log.len(), 2, "the second reply passed it: nothing more was sent");
    }
}

#[test]
fn on_a_cluster_a_pipelines_entries_go_one_by_one_each_answering_for_itself() {
    let mut s = Script::new();
    let plan = batch(3, false, true)(s.now);
    let got = s
        .run(plan, |send, _| match send {
            Send::Entry { at: 1, .. } => (
                BatchOutcome::Entry(Ok(error_value("CROSSSLOT Keys in request don't hash to the same slot")), None),
                ms(1),
            ),
            Send::Entry { at, .. } => (BatchOutcome::Entry(Ok(Value::Int(*at as i64)), None), ms(1)),
            other => panic!("{other:?}"),
        })
        .unwrap();
    assert_eq!(got.len(), 3);
    assert!(matches!(got[1], Value::ServerError(_)), "an error reply is that entry's answer");
    assert_eq!(s.log.len(), 3);
    // An entry the Cluster could not serve until the limit: nothing is left for the rest.
    let mut s = Script::new();
    let plan = batch(3, false, true)(s.now);
    let f = s
        .run(plan, |send, _| match send {
            Send::Entry { at: 0, .. } => (BatchOutcome::Entry(Ok(Value::Int(1)), None), ms(1)),
            Send::Entry { .. } => {
                (BatchOutcome::Entry(Ok(error_value("CLUSTERDOWN The cluster is down")), None), ms(990))
            }
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!(f.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        f.message,
        "CLUSTERDOWN The cluster is down (waited out to --timeout-ms): Redis answered the pipeline's first 1 of 3 commands (an error reply among them ran nothing), did not run the next, and the rest were not sent"
    );
    // No answer in time: the next may have run.
    let mut s = Script::new();
    let plan = batch(3, false, true)(s.now);
    let f = s.run(plan, |_, _| (BatchOutcome::Entry(Err(timed_out()), None), LIMIT)).unwrap_err();
    assert_eq!(
        f.message,
        "ERR the pipeline ran past --timeout-ms (1000 ms): Redis answered its first 0 of 3 commands (an error reply among them ran nothing), the next may or may not have, the rest were not sent"
    );
    // A money entry fewer replicas acknowledged fails the request: it ran, and may be lost.
    let mut s = Script::new();
    let wait = ReplicaWait { replicas: 1, timeout: ms(100) };
    let plan = Batch::new(s.now, 2, false, true, LIMIT, 1 << 20, Some(wait));
    let f = s.run(plan, |_, _| (BatchOutcome::Entry(Ok(Value::Int(1)), Some(Value::Int(0))), ms(1))).unwrap_err();
    assert_eq!(f.cause, Cause::NotDurable);
    assert_eq!(s.log.len(), 1);
}

#[test]
fn a_chunk_spanning_cluster_slots_is_halved_and_a_transaction_refused() {
    let mut s = Script::new();
    let plan = batch(4, false, false)(s.now);
    let mut first = true;
    let got = s.run(plan, |send, _| match send {
        // After the first chunk of one, the next of two spans slots once.
        Send::Chunk { range, .. } if range.len() == 2 && std::mem::take(&mut first) => {
            (BatchOutcome::Chunk(Ok(None)), ms(0))
        }
        Send::Chunk { range, .. } => (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(1)),
        other => panic!("{other:?}"),
    });
    assert_eq!(got.unwrap().len(), 4);
    assert_eq!(&s.sent()[1..3], ["Chunk { range: 1..3, within: 999ms }", "Chunk { range: 1..2, within: 999ms }"]);
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let f = s.run(plan, |_, _| (BatchOutcome::Chunk(Ok(None)), ms(1))).unwrap_err();
    assert_eq!(f.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        f.message,
        "CROSSSLOT a transaction's keys must hash to one slot on a Redis Cluster (use a {hash tag}); nothing ran"
    );
    let mut s = Script::new();
    let plan = batch(2, true, false)(s.now);
    let f = s.run(plan, |_, _| (BatchOutcome::Chunk(Ok(Some(Value::Int(3)))), ms(1))).unwrap_err();
    assert_eq!((f.status, f.message.as_str()), (StatusCode::BAD_GATEWAY, "ERR unexpected pipeline reply from Redis"));
}

fn node() -> Node {
    Node { host: "127.0.0.1".into(), port: 7001 }
}

#[test]
fn a_discarded_cluster_transaction_follows_the_ask_of_its_first_key() {
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let got = s.run(plan, |send, _| match send {
        Send::Chunk { .. } => (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(1)),
        Send::Locate { range, .. } => {
            assert_eq!(*range, 0..2);
            (BatchOutcome::Located(Ok(Some(node()))), ms(1))
        }
        Send::Asking { node: n, .. } => {
            assert_eq!(*n, node());
            (BatchOutcome::Asked(Asked::Ran(vec![Value::Int(1), Value::Int(2)])), ms(1))
        }
        other => panic!("{other:?}"),
    });
    assert_eq!(got.unwrap(), [Value::Int(1), Value::Int(2)]);
    assert_eq!(s.log.len(), 3, "sent once after ASKING, ran there once");
    // Lost on its way there: it may have run, so that is the answer.
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let f = s
        .run(plan, |send, _| match send {
            Send::Chunk { .. } => (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(1)),
            Send::Locate { .. } => (BatchOutcome::Located(Ok(Some(node()))), ms(1)),
            Send::Asking { .. } => (BatchOutcome::Asked(Asked::Failed(lost())), ms(1)),
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!(f.cause, Cause::Lost);
}

#[test]
fn a_valid_discarded_cluster_transaction_is_sent_again_until_the_limit_then_unavailable() {
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let mut asked = 0;
    let f = s
        .run(plan, |send, _| match send {
            Send::Chunk { .. } => (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(10)),
            Send::Locate { .. } => (BatchOutcome::Located(Ok(None)), ms(1)),
            Send::Asking { .. } => panic!("no ASK was found"),
            Send::MayRun { .. } => {
                asked += 1;
                (BatchOutcome::MayRun(true), ms(2))
            }
            Send::Follow { at } => {
                assert_eq!(*at, 0);
                (BatchOutcome::Followed, ms(1))
            }
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!(asked, 1, "whether it may run is asked once per request");
    assert_eq!(f.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        f.message,
        "ERR Redis discarded the transaction (EXECABORT) although each command is valid: its slot is moving between \
         Cluster nodes or cannot be served now (MOVED, ASK, TRYAGAIN, CLUSTERDOWN or OOM); nothing ran, retry"
    );
    let tries = s.sent().iter().filter(|s| s.starts_with("Chunk")).count();
    assert_eq!(tries, 25, "sent every 37 ms (10 + 1 + 1 + 25) while 100 ms were left: {:?}", s.sent());
    // Served once the slot has moved.
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let mut tries = 0;
    let got = s.run(plan, |send, _| match send {
        Send::Chunk { range, .. } => {
            tries += 1;
            if tries < 3 {
                (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(1))
            } else {
                (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), ms(1))
            }
        }
        Send::Locate { .. } => (BatchOutcome::Located(Ok(None)), ms(1)),
        Send::MayRun { .. } => (BatchOutcome::MayRun(true), ms(1)),
        Send::Follow { .. } => (BatchOutcome::Followed, ms(1)),
        other => panic!("{other:?}"),
    });
    assert_eq!(got.unwrap().len(), 2);
}

#[test]
fn a_cluster_transaction_redis_would_not_run_is_its_execabort() {
    let mut s = Script::new();
    let plan = batch(2, true, true)(s.now);
    let f = s
        .run(plan, |send, _| match send {
            Send::Chunk { .. } => (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(1)),
            Send::Locate { .. } => (BatchOutcome::Located(Ok(None)), ms(1)),
            Send::MayRun { .. } => (BatchOutcome::MayRun(false), ms(1)),
            other => panic!("{other:?}"),
        })
        .unwrap_err();
    assert_eq!((f.status, f.cause), (StatusCode::BAD_REQUEST, Cause::ExecAbort));
    // On one Redis an EXECABORT is the answer at once: Redis refused a queued command.
    let mut s = Script::new();
    let plan = batch(2, true, false)(s.now);
    let f =
        s.run(plan, |_, _| (BatchOutcome::Chunk(Err(reply("EXECABORT Transaction discarded"))), ms(1))).unwrap_err();
    assert_eq!(f.cause, Cause::ExecAbort);
    assert_eq!(s.log.len(), 1);
}

/// Random pipelines with random costs and outcomes (busy chunks, slow ones, timeouts) on a
/// virtual clock: every command is sent once and in order until the answer, no chunk is
/// larger than 32 or starts after the limit, a success answers every command, and the plan
/// always ends. `REDCOUNT_SEED` replays a run.
#[test]
fn random_pipelines_send_each_command_once_in_order_within_the_limit() {
    let seed: u64 = std::env::var("REDCOUNT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {seed} (replay: REDCOUNT_SEED={seed})");
    let mut x = seed | 1;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    for case in 0..2_000 {
        let n = rand(120) as usize;
        let mut s = Script::new();
        let plan = batch(n, false, false)(s.now);
        let mut next = 0usize;
        let mut last_start = None;
        let mut busy_left = rand(3);
        let timeout_at = rand(4) == 0;
        let got = s.run(plan, |send, at| {
            let Send::Chunk { range, within } = send else { panic!("case {case}: {send:?}") };
            assert!(range.len() <= MAX_CHUNK && !range.is_empty(), "case {case} (seed {seed}): {range:?}");
            assert_eq!(range.start, next, "case {case} (seed {seed}): in order, none twice");
            // A chunk refused busy may go again just past the limit; a new one never starts there.
            let again = last_start == Some(range.start);
            assert!(range.start == 0 || again || at < LIMIT, "case {case} (seed {seed}): a chunk after the limit");
            last_start = Some(range.start);
            assert!(*within >= ms(1) && *within <= LIMIT);
            if busy_left > 0 {
                busy_left -= 1;
                return (BatchOutcome::Chunk(Err(reply("BUSY busy"))), ms(rand(5)));
            }
            if timeout_at && rand(5) == 0 {
                return (BatchOutcome::Chunk(Err(timed_out())), *within);
            }
            next = range.end;
            let cost = ms(rand(40) * range.len() as u64);
            (BatchOutcome::Chunk(Ok(Some(ints(range.clone())))), cost)
        });
        match got {
            Ok(items) => {
                assert_eq!(items.len(), n, "case {case} (seed {seed})");
                assert_eq!(next, n);
            }
            Err(f) => assert!(
                f.status == StatusCode::GATEWAY_TIMEOUT || f.cause == Cause::Reply(ErrorKind::Unavailable),
                "case {case} (seed {seed}): {f:?}"
            ),
        }
    }
}
