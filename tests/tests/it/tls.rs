//! TLS everywhere a user needs it, with a CA made here: Redis on its TLS port (`rediss://`)
//! under the front, `redcount serve --redis` and `drain`; the front serving HTTPS (and
//! reloading its certificate on SIGHUP); `redcount serve --rest-url https://…`. Trust comes
//! from `SSL_CERT_FILE`, as it would for a private CA in production.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use redcount_tests::{NativeServer, RedisServer, RestFront, TEST_POLICIES, bin, free_port, scratch_dir, secret};
use serde_json::{Value, json};

/// A CA and a server certificate it signed, for `localhost` and 127.0.0.1, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, name: &str) -> Pki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("redcount test CA {name}"));
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let p = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}-key.pem")),
    };
    std::fs::write(&p.ca, ca.pem()).unwrap();
    std::fs::write(&p.cert, leaf.pem()).unwrap();
    std::fs::write(&p.key, leaf_key.serialize_pem()).unwrap();
    p
}

/// `redis-server` arguments for a TLS port with `p`'s certificate (clients not asked for one).
fn tls_args(p: &Pki, tls_port: u16) -> Vec<String> {
    let path = |f: &PathBuf| f.display().to_string();
    [
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        path(&p.cert),
        "--tls-key-file".into(),
        path(&p.key),
        "--tls-ca-cert-file".into(),
        path(&p.ca),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
    .into()
}

/// A Redis answering on a TLS port (plain port kept for the test's own checks).
fn tls_redis(p: &Pki) -> (RedisServer, u16) {
    let tls_port = free_port();
    let args = tls_args(p, tls_port);
    let redis = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    (redis, tls_port)
}

/// An HTTPS client that trusts only `ca`.
fn https_client(ca: &Path) -> reqwest::Client {
    redcount::tls::install_crypto_provider();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    redcount_tests::http_builder().tls_certs_only([ca]).timeout(Duration::from_secs(10)).build().unwrap()
}

async fn post(http: &reqwest::Client, url: &str, token: &str, body: Value) -> Result<(u16, Value), String> {
    let r = http.post(url).bearer_auth(token).body(body.to_string()).send().await.map_err(|e| format!("{e:?}"))?;
    let status = r.status().as_u16();
    Ok((status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_from_the_client_to_redis_and_a_certificate_reloaded_on_sighup() {
    let dir = scratch_dir("tls");
    let p = pki(&dir, "first");
    let (redis, tls_port) = tls_redis(&p);
    let rediss = format!("rediss://127.0.0.1:{tls_port}");
    let ca = p.ca.display().to_string();
    let (cert, key) = (p.cert.display().to_string(), p.key.display().to_string());

    // The front: HTTPS outside, rediss:// inside.
    let front =
        RestFront::start_env(&rediss, false, &["--tls-cert", &cert, "--tls-key", &key], &[("SSL_CERT_FILE", &ca)]);
    assert!(front.url().starts_with("https://"));
    let http = https_client(&p.ca);
    let (status, v) =
        post(&http, &format!("{}/", front.url()), &front.token, json!(["SET", "through", "tls"])).await.unwrap();
    assert_eq!((status, v), (200, json!({"result": "OK"})));
    let got: String = redis::cmd("GET").arg("through").query(&mut redis.conn()).unwrap();
    assert_eq!(got, "tls", "the write went through the TLS port to this Redis");
    let tls_clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut redis.conn()).unwrap();
    assert!(tls_clients.lines().count() >= 2, "the front holds connections: {tls_clients}");
    // Plain HTTP to the HTTPS port gets no answer.
    let plain = redcount_tests::http()
        .post(format!("http://127.0.0.1:{}/", front.port()))
        .bearer_auth(&front.token)
        .body(r#"["PING"]"#)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.map(|r| r.status().as_u16() != 200).unwrap_or(true), "plain HTTP was served on the TLS port");

    // The official clients, unmodified, over HTTPS (Node trusts the test's CA).
    let out = Command::new("node")
        .arg(redcount_tests::root().join("tests/node/upstash-conformance.mjs"))
        .current_dir(redcount_tests::root())
        .env("REST_URL", front.url())
        .env("REST_TOKEN", &front.token)
        .env("REST_READONLY_TOKEN", &front.readonly_token)
        .env("NODE_EXTRA_CA_CERTS", &ca)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains(", 0 failed"), "{stdout}{}", String::from_utf8_lossy(&out.stderr));

    // `redcount serve` through the HTTPS front, and directly over rediss://; drain too.
    let admin = secret("admin");
    let via_front = NativeServer::start(
        &[("REDCOUNT_REST_URL", &front.url()), ("REDCOUNT_REST_TOKEN", &front.token), ("SSL_CERT_FILE", &ca)],
        &admin,
        TEST_POLICIES,
    );
    let direct = NativeServer::start(&[("REDIS_URL", &rediss), ("SSL_CERT_FILE", &ca)], &admin, TEST_POLICIES);
    let plain_http = redcount_tests::http();
    for (server, subject) in [(&via_front, "via-front"), (&direct, "direct")] {
        let url = format!("{}/api/quotas/daily-prize/{subject}", server.url());
        let r = plain_http.post(&url).body("{}").send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!((status, v["remaining"].as_i64()), (200, Some(1)), "{subject}: {v}\n{}", server.log());
    }
    // Through a front whose certificate it does not trust, `redcount serve` fails closed and
    // its log says why (the TLS reason, not only "error sending request").
    let distrust = NativeServer::start(
        &[
            ("REDCOUNT_REST_URL", &front.url()),
            ("REDCOUNT_REST_TOKEN", &front.token),
            ("SSL_CERT_FILE", dir.join("nothing.pem").to_str().unwrap()),
        ],
        &admin,
        TEST_POLICIES,
    );
    let r = plain_http.post(format!("{}/api/quotas/daily-prize/x", distrust.url())).body("{}").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let log = distrust.log().to_lowercase();
    assert!(log.contains("certificate") && log.contains("issuer"), "{log}");
    // `redcount serve` serving HTTPS itself.
    let https_serve = NativeServer::start_with(
        &[("REDIS_URL", &rediss), ("SSL_CERT_FILE", &ca)],
        &admin,
        TEST_POLICIES,
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    let url = format!("https://localhost:{}/api/claims/signup-bonus/over-https", https_serve.port());
    let r = http.post(&url).body("").send().await.unwrap();
    let status = r.status().as_u16();
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!((status, v["claimed"].as_bool()), (200, Some(true)), "{v}\n{}", https_serve.log());
    let plain = plain_http.post(format!("http://127.0.0.1:{}/api/health", https_serve.port())).send().await;
    assert!(plain.map(|r| r.status().as_u16() != 200).unwrap_or(true), "plain HTTP served on serve's TLS port");
    let r = plain_http
        .post(format!("{}/api/redpackets", direct.url()))
        .body(r#"{"total_cents": 300, "count": 3}"#)
        .send()
        .await
        .unwrap();
    let made: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    let id = made["id"].as_str().expect("a packet").to_string();
    let r = plain_http.post(format!("{}/api/redpackets/{id}/grab", direct.url())).body(r#"{"user":"u1"}"#).send().await;
    assert_eq!(r.unwrap().status().as_u16(), 200);
    let db = dir.join("drain.sqlite");
    let out = Command::new(bin("redcount"))
        .args(["drain", "--redis", &rediss, "--db"])
        .arg(&db)
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    assert!(out.status.success(), "drain over rediss://: {}", String::from_utf8_lossy(&out.stderr));
    let n: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM claims WHERE packet = ?1", [&id], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "drain copied the one grab over TLS");

    // Without the CA, nothing trusts the certificate: each fails at start, saying why.
    let untrusted = Command::new(bin("redcount"))
        .args(["serve", "--listen", "127.0.0.1:0", "--redis", &rediss])
        .env("REDCOUNT_POLICIES", TEST_POLICIES)
        .env("SSL_CERT_FILE", dir.join("nothing.pem"))
        .output()
        .unwrap();
    assert!(!untrusted.status.success(), "redcount serve trusted an unknown CA");
    let why = String::from_utf8_lossy(&untrusted.stderr).to_lowercase();
    assert!(why.contains("certificate") || why.contains("tls") || why.contains("issuer"), "{why}");

    // SIGHUP: the front takes a certificate from another CA for new connections.
    let second = pki(&dir, "second");
    let fresh = https_client(&second.ca);
    assert!(
        post(&fresh, &format!("{}/", front.url()), &front.token, json!(["PING"])).await.is_err(),
        "a client trusting only the second CA accepted the first certificate"
    );
    std::fs::copy(&second.cert, &p.cert).unwrap();
    std::fs::copy(&second.key, &p.key).unwrap();
    let hup = Command::new("kill").args(["-HUP", &front.pid().to_string()]).status().unwrap();
    assert!(hup.success());
    let mut answered = None;
    for _ in 0..50 {
        if let Ok(r) = post(&fresh, &format!("{}/", front.url()), &front.token, json!(["PING"])).await {
            answered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answered,
        Some((200, json!({"result": "PONG"}))),
        "after SIGHUP the new certificate is served\n{}",
        front.log()
    );
    // A broken file on the next SIGHUP keeps the certificate in use.
    std::fs::write(&p.cert, "not a certificate").unwrap();
    assert!(Command::new("kill").args(["-HUP", &front.pid().to_string()]).status().unwrap().success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = post(&fresh, &format!("{}/", front.url()), &front.token, json!(["PING"])).await.unwrap();
    assert_eq!(status, 200, "a failed reload keeps the certificate in use");
    assert!(front.log().contains("not reloaded"), "{}", front.log());
}

/// A Redis Cluster reached only over TLS (`tls-cluster yes`: nodes announce their TLS ports):
/// the front and `redcount serve` take `rediss://` seeds and follow the cluster's topology
/// over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    let dir = scratch_dir("tls-cluster");
    let p = pki(&dir, "cluster");
    let ca = p.ca.display().to_string();
    let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let nodes: Vec<RedisServer> = tls_ports
        .iter()
        .map(|&port| {
            let mut args = tls_args(&p, port);
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            args.extend(redcount_procs::CLUSTER_NODE.map(String::from));
            RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect();
    redcount_procs::cluster_create_with(&tls_ports, &["--tls", "--cacert", &ca]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for n in &nodes {
        while !redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut n.conn()).unwrap().contains("cluster_state:ok") {
            assert!(std::time::Instant::now() < deadline, "the TLS cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let cluster = redcount_tests::RedisCluster { nodes };
    let seeds = tls_ports.iter().map(|p| format!("rediss://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let front = RestFront::start_env(&seeds, true, &[], &[("SSL_CERT_FILE", &ca)]);
    let http = redcount_tests::http();
    let body = json!([["INCR", "t1"], ["INCR", "t2"], ["INCR", "t3"], ["INCR", "t4"], ["INCR", "t5"]]);
    let (status, v) = post(&http, &format!("{}/pipeline", front.url()), &front.token, body).await.unwrap();
    assert_eq!(status, 200, "{v}\n{}", front.log());
    assert!(v.as_array().unwrap().iter().all(|e| e["result"] == 1), "{v}");
    // The keys are spread over the masters: the front reached each over TLS.
    let holding =
        cluster.nodes.iter().filter(|n| redis::cmd("DBSIZE").query::<i64>(&mut n.conn()).unwrap() > 0).count();
    assert!(holding >= 2, "t1..t5 are on {holding} master(s)");
    let admin = secret("admin");
    let serve = NativeServer::start_with(
        &[("REDIS_URL", &seeds), ("SSL_CERT_FILE", &ca)],
        &admin,
        TEST_POLICIES,
        &["--cluster"],
    );
    for subject in ["a", "b", "c", "d"] {
        let r = http.post(format!("{}/api/quotas/daily-prize/{subject}", serve.url())).body("{}").send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!((status, v["remaining"].as_i64()), (200, Some(1)), "{subject}: {v}\n{}", serve.log());
    }
}

/// At the per-address cap, connections of that address that never finish their TLS handshake
/// make room for a newcomer of the same address, as idle ones do (past a second each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_per_address_cap_a_stalled_handshake_makes_room() {
    let dir = scratch_dir("tls-per-ip");
    let p = pki(&dir, "front");
    let redis = RedisServer::start();
    let (cert, key) = (p.cert.display().to_string(), p.key.display().to_string());
    let front = RestFront::start_with(
        &redis.url(),
        false,
        &["--tls-cert", &cert, "--tls-key", &key, "--max-connections-per-ip", "20"],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let from = [127, 0, 13, 1];
    let port = front.port();
    let stall = move || -> std::net::TcpStream {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&std::net::SocketAddr::from((from, 0)).into()).unwrap();
        s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).unwrap();
        s.into()
    };
    let mut stalled: Vec<std::net::TcpStream> = (0..20).map(|_| stall()).collect();
    let mut newer = Vec::new();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    redcount::tls::install_crypto_provider();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&p.ca).unwrap()).unwrap();
    for i in 0..3 {
        // A client of its own each time, keeping no connection: each request is a newcomer.
        let http = redcount_tests::http_builder()
            .tls_certs_only([ca.clone()])
            .local_address(std::net::IpAddr::from(from))
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let answer = post(&http, &front.url(), &front.token, json!(["PING"])).await;
        assert!(
            matches!(answer, Ok((200, _))),
            "request {i} while the address's places hold stalled handshakes: {answer:?}"
        );
        // Once its place is given back, a newcomer that never shakes hands fills it (too
        // young to be evicted): the next request must make room again.
        tokio::time::sleep(Duration::from_millis(100)).await;
        newer.push(stall());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed_now = |s: &mut std::net::TcpStream| {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        match s.read(&mut [0u8; 16]) {
            Ok(0) => true,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            Ok(_) => false,
        }
    };
    assert_eq!(newer.iter_mut().map(closed_now).filter(|c| *c).count(), 0, "younger ones were kept");
    let closed = stalled.iter_mut().map(closed_now).filter(|c| *c).count();
    assert_eq!(closed, 3, "each request took the place of one stalled handshake");
}

/// Both servers' `--help` say how to trust a private CA, not only the docs.
#[test]
fn the_help_says_how_to_trust_a_private_ca() {
    for args in [&["--help"][..], &["serve", "--help"]] {
        let name = if args.len() == 1 { "redcount-rest" } else { "redcount" };
        let out = Command::new(bin(name)).args(args).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && help.contains("SSL_CERT_FILE") && help.contains("private CA"),
            "{name} {args:?}: {help}"
        );
    }
    // And what the front adds to a --tokens user's rules.
    let out = Command::new(bin("redcount-rest")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("ACL SETUSER") && help.contains("SELECT, MOVE, COPY"), "{help}");
}
