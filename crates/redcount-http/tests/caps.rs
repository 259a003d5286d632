//! One client must not stop or exhaust a server: connection floods and slow clients against
//! [`redcount_http::serve`], which both servers (the front, `redcount serve`) serve with, in
//! this process on a loopback port. The app behind it answers as theirs do where it matters
//! here: it reads the whole body, then answers 200, or 401 to the token `wrong`. (Each
//! server's flags are read into these `Limits` by its own tests.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use redcount_http::Limits;
use redcount_procs::client::{hold_from, request, request_from};

/// A server on a loopback port, on a runtime of its own, stopped on drop.
struct Server {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(limits: Limits) -> Server {
        let (ready, started) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
                ready.send(listener.local_addr().unwrap().port()).unwrap();
                let app = axum::Router::new().fallback(answer);
                let stop = async {
                    let _ = stopped.await;
                };
                redcount_http::serve(listener, app, limits, stop).await.unwrap();
            });
        });
        Server { port: started.recv().unwrap(), stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(std::thread::JoinHandle::join);
    }
}

/// Requests to `/slow` the app has run to their end.
static SLOW_RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What both servers do with a request, as far as the caps see it: the body read whole, then
/// an answer (after 20 ms on `/slow`, as a call waits for Redis).
async fn answer(
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], &'static str) {
    let json = [(header::CONTENT_TYPE, "application/json")];
    if axum::body::to_bytes(body, 1 << 20).await.is_err() {
        return (StatusCode::PAYLOAD_TOO_LARGE, json, r#"{"error":"too large"}"#);
    }
    if uri.path() == "/slow" {
        tokio::time::sleep(Duration::from_millis(20)).await;
        SLOW_RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    match headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        Some("Bearer wrong") => (StatusCode::UNAUTHORIZED, json, r#"{"error":"Unauthorized"}"#),
        _ => (StatusCode::OK, json, r#"{"result":"PONG"}"#),
    }
}

/// Opens `n` connections from 127.0.0.1 that send nothing; the caller holds them open.
fn hold(port: u16, n: usize) -> Vec<TcpStream> {
    hold_from([127, 0, 0, 1], port, n)
}

/// Whether the server has closed the connection by now, without waiting (for many
/// connections at once: [`closed_by_server`] waits 50 ms on each open one).
fn closed_now(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 512];
    let closed = loop {
        match s.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// True once the server has closed the connection (EOF or reset on read).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Holds 1,100 idle and 50 slow-header connections against `port` (from three addresses,
/// each within the per-address bound) while `ok` requests must succeed, then checks the
/// server dropped the idle and slow ones by itself.
fn flood_then_check(port: u16, header_timeout: Duration, ok: impl Fn() -> u16) {
    let mut idle = hold_from([127, 0, 0, 2], port, 550);
    idle.extend(hold_from([127, 0, 0, 3], port, 550));
    let mut slow = hold_from([127, 0, 0, 4], port, 50);
    let start = Instant::now();
    let head = b"POST / HTTP/1.1\r\nhost: x\r\n";
    let mut i = 0;
    // While they are held (and the slow ones keep trickling), normal requests are served.
    while start.elapsed() < header_timeout / 2 {
        for s in &mut slow {
            let _ = s.write_all(&head[i % head.len()..i % head.len() + 1]);
        }
        i += 1;
        assert_eq!(ok(), 200, "a normal request while 1,150 connections are held");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(header_timeout + Duration::from_millis(700));
    let idle_closed = idle.iter_mut().map(closed_by_server).filter(|c| *c).count();
    let slow_closed = slow.iter_mut().map(closed_by_server).filter(|c| *c).count();
    assert_eq!(idle_closed, idle.len(), "idle connections are closed after the header timeout");
    assert_eq!(slow_closed, slow.len(), "slow-header connections are closed after the header timeout");
    assert_eq!(ok(), 200);
}

#[test]
fn a_server_holds_against_idle_slow_and_too_many_connections() {
    let server = Server::start(Limits { header_timeout: Duration::from_millis(1500), ..Limits::default() });
    let ping = || request(server.port, "POST", "/", "t", r#"["PING"]"#).0;
    flood_then_check(server.port, Duration::from_millis(1500), ping);

    // Past the cap, a connection is told why and closed; the held ones keep working.
    let capped = Server::start(Limits { max_connections: 20, ..Limits::default() });
    let held = hold(capped.port, 20);
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = request(capped.port, "POST", "/", "t", r#"["PING"]"#);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many connections"), "{body}");
    assert!(serde_json_error(&body), "the refusal is JSON: {body}");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(request(capped.port, "POST", "/", "t", r#"["PING"]"#).0, 200);

    // A cap full of connections from many addresses that never send a request (a
    // distributed slow-header flood): past a second, a new client takes the place of the
    // oldest of them, every time.
    let mut flood: Vec<TcpStream> = (0..20u8).flat_map(|i| hold_from([127, 0, 2, i], capped.port, 1)).collect();
    for s in flood.iter_mut() {
        let _ = s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\n");
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let mut newer = Vec::new();
    for i in 0..5u8 {
        let (status, body) = request(capped.port, "POST", "/", "t", r#"["PING"]"#);
        assert_eq!(status, 200, "request {i} while the cap is full of head-less connections: {body}");
        // The request's place is given back just after the client sees its connection end;
        // until then a newcomer would find the cap full and take a second old one's place.
        std::thread::sleep(Duration::from_millis(100));
        // A newcomer that sends nothing takes the freed place (too young to be evicted).
        newer.extend(hold_from([127, 0, 3, i], capped.port, 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed = flood.iter_mut().map(closed_by_server).filter(|c| *c).count();
    assert_eq!(closed, 5, "each request took the place of the oldest waiting connection");
    assert_eq!(newer.iter_mut().map(closed_by_server).filter(|c| *c).count(), 0, "younger ones were kept");
}

/// Whether `body` is a JSON object with an `error` text (a minimal reading: no JSON parser
/// here).
fn serde_json_error(body: &str) -> bool {
    body.starts_with("{\"error\":\"") && body.ends_with("\"}")
}

/// One address cannot take every slot (a newcomer of an address at its limit takes the place
/// of that address's connection idle longest: it never holds more), and a client without a
/// valid token cannot keep a connection by sending requests. (A newcomer is refused only when
/// every connection of its address has a request at work: `redcount-http`
/// `tests::at_the_per_address_cap_requests_at_work_are_never_cut_off`.)
#[test]
fn one_address_or_a_tokenless_client_cannot_hold_the_server() {
    let server = Server::start(Limits { max_per_ip: 10, ..Limits::default() });
    let port = server.port;
    let mut held = hold_from([127, 0, 0, 2], port, 10);
    std::thread::sleep(Duration::from_millis(300));
    let (status, answer) = request_from([127, 0, 0, 2], port, "GET", "/", "", "");
    assert!(status == 200 || status == 401, "the 11th of the address: {status} {answer}");
    let closed: Vec<bool> = held.iter_mut().map(closed_by_server).collect();
    assert_eq!(closed.iter().filter(|c| **c).count(), 1, "one place given up, the oldest's: {closed:?}");
    assert!(closed[0], "the oldest gave up its place: {closed:?}");
    // Another client is served meanwhile.
    let (status, _) = request(port, "GET", "/", "", "");
    assert!(status == 200 || status == 401, "{status}");
    drop(held);

    // A wrong token: 401, and the server closes the connection although the client asked to
    // keep it.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer wrong\r\ncontent-length: 2\r\n\r\n{{}}").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
    assert!(out.to_ascii_lowercase().contains("connection: close"), "{out}");
}

/// At the cap, connections parked between requests (a keep-alive flood: one request each,
/// then idle, which the header timeout alone lets live for its full length each time) and
/// connections trickling a request body are closed, oldest first, to make room; a
/// connection whose request is at work is never closed.
fn cap_evicts_parked_and_slow_body_connections(port: u16, address: impl Fn([u8; 4]) -> [u8; 4]) {
    let (request_head, body) = ("POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n", r#"["PING"]"#);
    let send = |from: [u8; 4], keep: bool| {
        let from = address(from);
        let mut s = hold_from(from, port, 1).pop().unwrap();
        let connection = if keep { "keep-alive" } else { "close" };
        write!(s, "{request_head}content-length: {}\r\nconnection: {connection}\r\n\r\n{body}", body.len()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = vec![0u8; 4096];
        let n = s.read(&mut got).unwrap_or(0);
        if !keep {
            // Until the server has closed it, and a moment for its place to be given back:
            // the next connection must not find the cap still full and evict one more.
            let _ = s.read_to_end(&mut Vec::new());
            std::thread::sleep(Duration::from_millis(50));
        }
        (s, String::from_utf8_lossy(&got[..n]).into_owned())
    };
    let mut parked = Vec::new();
    for i in 0..20u8 {
        let (s, answer) = send([127, 0, 4, i], true);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        parked.push(s);
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let mut newer = Vec::new();
    for i in 0..5u8 {
        let (_, answer) = send([127, 0, 5, i], false);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "request {i} while the cap is full of parked connections: {answer}"
        );
        // A newcomer takes the freed place, so the cap stays full.
        newer.extend(hold_from(address([127, 0, 8, i]), port, 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed: Vec<usize> =
        parked.iter_mut().enumerate().filter_map(|(i, s)| closed_by_server(s).then_some(i)).collect();
    assert_eq!(closed, vec![0, 1, 2, 3, 4], "each request took the place of the longest-parked connection");
    drop((parked, newer));
    std::thread::sleep(Duration::from_millis(300));

    // The same with bodies trickled a byte at a time.
    let head = format!("{request_head}content-length: 1000\r\n\r\n");
    let mut slow: Vec<TcpStream> = (0..20u8)
        .map(|i| {
            let mut s = hold_from(address([127, 0, 6, i]), port, 1).pop().unwrap();
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    for _ in 0..6 {
        for s in &mut slow {
            let _ = s.write_all(b" ");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut newer = Vec::new();
    for i in 0..5u8 {
        let (_, answer) = send([127, 0, 7, i], false);
        assert!(answer.starts_with("HTTP/1.1 200"), "request {i} while the cap is full of slow bodies: {answer}");
        newer.extend(hold_from(address([127, 0, 9, i]), port, 1));
        for s in &mut slow {
            let _ = s.write_all(b" ");
        }
    }
    let closed: Vec<usize> =
        slow.iter_mut().enumerate().filter_map(|(i, s)| closed_by_server(s).then_some(i)).collect();
    // (Their order is that in which their heads were parsed, not quite that of connecting.)
    assert_eq!(closed.len(), 5, "each request took the place of one slow body: {closed:?}");
    assert_eq!(newer.iter_mut().map(closed_by_server).filter(|c| *c).count(), 0, "younger ones were kept");
}

#[test]
fn at_the_cap_parked_and_slow_body_connections_make_room() {
    // A long stall timeout: the slow bodies must be closed by eviction only.
    let limits = Limits { max_connections: 20, stall_timeout: Duration::from_secs(60), ..Limits::default() };
    let server = Server::start(limits);
    cap_evicts_parked_and_slow_body_connections(server.port, |a| a);
}

/// At the per-address cap, as at the global one, a newcomer from that address takes the place
/// of that address's connection with no request at work for longest (a second at least):
/// 1,000 half-sent request heads from one address (users behind one NAT or proxy share it)
/// locked every other client of that address out until the header timeout (default limits).
/// Then parked keep-alive connections and trickled bodies, all from one address, with a
/// per-address cap of 20 under a global one of 10,000.
#[test]
fn at_the_per_address_cap_slow_heads_parked_and_slow_bodies_make_room() {
    let server = Server::start(Limits::default());
    let (port, from) = (server.port, [127, 0, 10, 1]);
    let ok = |from: [u8; 4]| request_from(from, port, "POST", "/", "t", r#"["PING"]"#);
    let mut heads = hold_from(from, port, 1_000);
    for s in &mut heads {
        let _ = s.write_all(b"POS");
    }
    std::thread::sleep(Duration::from_millis(1_200));
    let mut newer = Vec::new();
    for i in 0..5 {
        let (status, body) = ok(from);
        assert_eq!(status, 200, "request {i} from an address whose 1,000 places hold half-sent heads: {body}");
        // Until the server has let the request's place go, then a newcomer of the same
        // address that sends nothing takes it (too young to be evicted).
        std::thread::sleep(Duration::from_millis(50));
        newer.extend(hold_from(from, port, 1));
        std::thread::sleep(Duration::from_millis(100));
    }
    // A moment for the last eviction's close to arrive, then all at once (well within the
    // header timeout).
    std::thread::sleep(Duration::from_millis(100));
    let closed: Vec<usize> = heads.iter_mut().enumerate().filter_map(|(i, s)| closed_now(s).then_some(i)).collect();
    assert_eq!(closed, vec![0, 1, 2, 3, 4], "each request took the place of the address's oldest head");
    assert_eq!(newer.iter_mut().map(closed_by_server).filter(|c| *c).count(), 0, "younger ones were kept");
    // Another address was never concerned.
    assert_eq!(ok([127, 0, 11, 1]).0, 200);
    drop((server, heads, newer));

    let one = |_: [u8; 4]| [127, 0, 12, 1];
    let limits = Limits { max_per_ip: 20, stall_timeout: Duration::from_secs(60), ..Limits::default() };
    let server = Server::start(limits);
    cap_evicts_parked_and_slow_body_connections(server.port, one);
}

/// Keep-alive connections from `from` holding `n` places, each sending `request` again every
/// `every` (so never idle a second) until `stop`; each thread answers how many were served.
fn busy_from(
    from: [u8; 4],
    port: u16,
    n: usize,
    request: &str,
    every: Duration,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<usize>> {
    hold_from(from, port, n)
        .into_iter()
        .map(|mut s| {
            let (request, stop) = (request.to_string(), stop.clone());
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut served = 0;
                let mut got = vec![0u8; 8192];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if s.write_all(request.as_bytes()).is_err() {
                        break;
                    }
                    match s.read(&mut got) {
                        Ok(n) if n > 0 && got.starts_with(b"HTTP/1.1 200") => served += 1,
                        _ => break,
                    }
                    std::thread::sleep(every);
                }
                served
            })
        })
        .collect()
}

/// One client behind a shared address keeps every place of that address with keep-alive
/// connections each sending a cheap request more often than once a second, so none is idle a
/// second: every other client of that address got 503 for as long as it kept going (at the
/// default 1,000, with requests every 0.9 s, 17,000 requests, none evicted; here 50 places,
/// every 0.5 s). Now a newcomer takes the place of one parked between its requests. Also at
/// the global cap, from the few addresses holding most of it.
#[test]
fn busy_keep_alive_connections_make_room_at_the_caps() {
    let ping = "POST / HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\ncontent-length: 8\r\n\r\n[\"PING\"]";
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = Server::start(Limits { max_per_ip: 50, ..Limits::default() });
    let from = [127, 0, 20, 1];
    let flood = busy_from(from, server.port, 50, ping, Duration::from_millis(500), &stop);
    std::thread::sleep(Duration::from_millis(1_500));
    for i in 0..5 {
        let (status, answer) = request_from(from, server.port, "POST", "/", "t", r#"["PING"]"#);
        assert_eq!(status, 200, "request {i} from an address whose places are all kept busy: {answer}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: usize = flood.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(served >= 50, "the flood was served too ({served})");
    drop(server);

    // The global cap (40), held by two addresses of 20 each, all busy: a third address gets in.
    let server = Server::start(Limits { max_connections: 40, max_per_ip: 20, ..Limits::default() });
    stop.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut flood = busy_from([127, 0, 21, 1], server.port, 20, ping, Duration::from_millis(300), &stop);
    flood.extend(busy_from([127, 0, 21, 2], server.port, 20, ping, Duration::from_millis(300), &stop));
    std::thread::sleep(Duration::from_millis(1_000));
    for i in 0..5 {
        let (status, answer) = request_from([127, 0, 21, 3], server.port, "POST", "/", "t", r#"["PING"]"#);
        assert_eq!(status, 200, "request {i} at the global cap, held by two busy addresses: {answer}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
}

/// A client that sends its request and half-closes its side at once (`shutdown(Write)`, as
/// one-shot clients do) gets the answer of every request the server ran: none is dropped at
/// the read side's end after its work (a command) was done, alone or after pipelined ones.
#[test]
fn a_request_followed_by_a_half_close_is_answered() {
    let server = Server::start(Limits::default());
    let before = SLOW_RUN.load(std::sync::atomic::Ordering::SeqCst);
    let request = "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    let mut answered = 0;
    for pipelined in [1, 1, 1, 1, 1, 3] {
        for _ in 0..10 {
            let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(request.repeat(pipelined).as_bytes()).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            let n = out.matches("HTTP/1.1 200 OK").count();
            assert_eq!(n, pipelined, "{pipelined} request(s) then a half-close: {out:?}");
            answered += n;
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(SLOW_RUN.load(std::sync::atomic::Ordering::SeqCst) - before, answered, "every request run was answered");
}
