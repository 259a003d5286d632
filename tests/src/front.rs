//! The front in this process: `redcount_front::app` served on a loopback port by a runtime of
//! its own, as the binary serves it, with no process to start. Its log is kept, so a test reads
//! it as it would the process's. And one redis-server that tests which need no Redis of their
//! own share, each in a database of its own.

use std::sync::{Arc, Mutex, Weak};

use crate::{RedisServer, secret};

/// The front, in this process, stopped on drop.
#[derive(Debug)]
pub struct Front {
    port: u16,
    /// Its full-access token.
    pub token: String,
    /// Its read-only token.
    pub readonly_token: String,
    log: Log,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Front {
    /// Starts the front before `redis_url` (several URLs, comma-separated, with `cluster`).
    pub fn start(redis_url: &str, cluster: bool) -> Self {
        Self::start_with(redis_url, cluster, &[])
    }

    /// Starts it with extra flags, read as the binary reads its command line.
    pub fn start_with(redis_url: &str, cluster: bool, extra: &[&str]) -> Self {
        Self::try_start_with(redis_url, cluster, extra).unwrap_or_else(|e| panic!("the front did not start: {e}"))
    }

    /// [`Front::start_with`], or why the front refused to start (what the binary prints
    /// before it exits with a failure).
    pub fn try_start_with(redis_url: &str, cluster: bool, extra: &[&str]) -> Result<Self, String> {
        let (token, readonly_token) = (secret("tok"), secret("ro"));
        let mut args = vec!["redcount-rest", "--listen", "127.0.0.1:0", "--redis", redis_url, "--log", "debug"];
        args.extend(["--token", &token, "--readonly-token", &readonly_token]);
        if cluster {
            args.push("--cluster");
        }
        args.extend(extra);
        let config = redcount_front::Config::from_args(args)?;
        let log = Log::default();
        let (ready, started) = std::sync::mpsc::channel::<Result<u16, String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let dispatch = log.dispatch();
        let thread = std::thread::spawn(move || {
            let _logged = tracing::dispatcher::set_default(&dispatch);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                // Every thread of the front's runtime logs to its log (the guard lives as
                // long as the thread).
                .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&dispatch)))
                .build()
                .expect("a runtime for the front");
            runtime.block_on(serve(config, ready, stopped));
        });
        let port = match started.recv().expect("the front's thread") {
            Ok(port) => port,
            Err(e) => {
                let _ = thread.join();
                return Err(e);
            }
        };
        Ok(Front { port, token, readonly_token, log, stop: Some(stop), thread: Some(thread) })
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything it logged so far (debug level: a line per request).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The front's life on its own runtime: connected, then served until `stopped`.
async fn serve(
    config: redcount_front::Config,
    ready: std::sync::mpsc::Sender<Result<u16, String>>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let (front, background) = match redcount_front::app(&config).await {
        Ok(app) => app,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("a loopback port");
    let _ = ready.send(Ok(listener.local_addr().expect("its address").port()));
    let stop = async {
        let _ = stopped.await;
    };
    if let Err(e) = redcount_front::serve(listener, front, &config, stop).await {
        eprintln!("the front stopped: {e}");
    }
    drop(background);
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A log kept in memory.
#[derive(Debug, Default, Clone)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    /// A subscriber writing to this log as the binary writes to stderr (`--log debug`, text).
    fn dispatch(&self) -> tracing::Dispatch {
        let log = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || log.clone())
            .finish();
        tracing::Dispatch::new(subscriber)
    }
}

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A database of the redis-server that tests share ([`shared_redis`]): keys of its own, the
/// server's settings, scripts, ACL users and channels shared with the other tests.
#[derive(Debug)]
pub struct SharedDb {
    server: Arc<RedisServer>,
    db: u32,
}

/// A database of its own on the redis-server that tests share: started by the first test that
/// asks, stopped when the last one holding it ends (a later test starts another). For tests
/// that change nothing server-wide (settings, the script cache) and count nothing server-wide.
pub fn shared_redis() -> SharedDb {
    static SHARED: Mutex<(Weak<RedisServer>, u32)> = Mutex::new((Weak::new(), 0));
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let server = match slot.0.upgrade() {
        Some(server) => server,
        None => {
            let server = Arc::new(RedisServer::start_with(&["--databases", "10000"]));
            *slot = (Arc::downgrade(&server), 0);
            server
        }
    };
    slot.1 += 1;
    SharedDb { server, db: slot.1 }
}

impl SharedDb {
    /// Its URL (the server's, with the database).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/{}", self.server.port(), self.db)
    }

    /// A plain synchronous connection to its database.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().expect("connect to the shared redis")
    }
}
