//! A TCP proxy that delays every byte by a fixed time each way: Redis as far away as a
//! same-region one (a round trip of about 1 ms, where loopback's is about 0.1 ms), for the
//! benchmark only. Ordered and pipelined: a chunk read at t is written at t + delay, whatever
//! follows it, so the delay adds latency and no queueing of its own.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Listens on a free loopback port, forwarding each connection to `target` (a loopback port)
/// with `delay` added each way; runs until the process ends. The port.
pub fn proxy(target: u16, delay: Duration) -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
            let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
            for s in [&client, &server] {
                let _ = s.set_nodelay(true);
            }
            pipe(client, s2, delay);
            pipe(server, c2, delay);
        }
    });
    Ok(port)
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (at, bytes) in rx {
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// The median round trip of a Redis PING through `port`, in ms (200 of them, one at a time).
pub fn ping_ms(port: u16) -> Result<f64, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    let mut buf = [0u8; 16];
    for _ in 0..200 {
        let t = Instant::now();
        s.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
        let mut got = 0;
        while got < 7 {
            got += match s.read(&mut buf[got..]) {
                Ok(0) | Err(_) => return Err("the proxy closed the connection".into()),
                Ok(n) => n,
            };
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(crate::workerd::median(&times))
}
