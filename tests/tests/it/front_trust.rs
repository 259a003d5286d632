//! redcount-rest's trust boundary, with cases generated from Redis's own `COMMAND` table:
//! the read-only token changes nothing by any way in, and the full token cannot administer
//! Redis unless the front was started with `--allow-admin-commands`.

use redcount_tests::{Front, RedisServer};
use redis::Value as R;
use serde_json::{Value, json};

/// One command of the table: its name (and subcommand), arity and legacy key positions.
pub(crate) struct Entry {
    pub(crate) words: Vec<String>,
    pub(crate) arity: i64,
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) step: i64,
    pub(crate) flags: Vec<String>,
    pub(crate) categories: Vec<String>,
    /// No key positions and no key specs: it names no key (it may still reach every key).
    pub(crate) keyless: bool,
}

impl Entry {
    /// What the front treats as administration: flag `admin`, ACL category `@admin`, MIGRATE.
    pub(crate) fn is_admin(&self) -> bool {
        self.flags.iter().any(|f| f == "admin")
            || self.categories.iter().any(|c| c == "@admin")
            || self.words == ["migrate"]
    }
}

fn text(v: &R) -> String {
    match v {
        R::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
        R::SimpleString(s) => s.to_lowercase(),
        other => format!("{other:?}"),
    }
}

fn items(v: &R) -> &[R] {
    match v {
        R::Array(a) | R::Set(a) => a,
        _ => &[],
    }
}

fn int(v: &R) -> i64 {
    match v {
        R::Int(i) => *i,
        _ => 0,
    }
}

pub(crate) fn entries(redis: &RedisServer) -> Vec<Entry> {
    let reply: R = redis::cmd("COMMAND").query(&mut redis.conn()).unwrap();
    let mut out = Vec::new();
    fn add(e: &R, out: &mut Vec<Entry>) {
        let e = items(e);
        let name = text(&e[0]);
        let subs = e.get(9).map(items).unwrap_or(&[]);
        if !subs.is_empty() {
            for s in subs {
                add(s, out);
            }
            return;
        }
        out.push(Entry {
            words: name.split('|').map(str::to_string).collect(),
            arity: int(&e[1]),
            first: int(&e[3]),
            last: int(&e[4]),
            step: int(&e[5]),
            flags: items(&e[2]).iter().map(text).collect(),
            categories: e.get(6).map(items).unwrap_or(&[]).iter().map(text).collect(),
            keyless: int(&e[3]) == 0 && e.get(8).map(items).unwrap_or(&[]).is_empty(),
        });
    }
    for e in items(&reply) {
        add(e, &mut out);
    }
    assert!(out.len() > 200, "COMMAND listed {} commands", out.len());
    out
}

/// Plausible argument lists for one command: its arity's worth (and two more for variadic
/// ones), every key position naming the key `key`, every other argument `arg`.
pub(crate) fn argument_lists(e: &Entry, key: &str, arg: &str) -> Vec<Vec<String>> {
    let least = if e.arity < 0 { -e.arity - 1 } else { e.arity - 1 } as usize;
    let mut lens = vec![least];
    if e.arity < 0 {
        lens.push(least + 2);
    }
    lens.into_iter()
        .map(|n| {
            let mut v: Vec<String> = e.words.clone();
            for i in v.len()..=n {
                // Position i counts from the command name at 0.
                let i = i as i64;
                let last = if e.last < 0 { n as i64 + 1 + e.last } else { e.last };
                let is_key = e.first > 0 && i >= e.first && i <= last && (i - e.first) % e.step.max(1) == 0;
                v.push(if is_key { key.to_string() } else { arg.to_string() });
            }
            v
        })
        .collect()
}

/// What the read-only token must never change, and what an administrator could.
#[derive(Debug, PartialEq)]
struct Snapshot {
    digest: String,
    /// Key → its value's digest, to name what changed.
    values: Vec<(String, String)>,
    dbsize: i64,
    config: Vec<String>,
    acl: Vec<String>,
    functions: Vec<u8>,
    slowlog_len: i64,
}

fn snapshot(redis: &RedisServer) -> Snapshot {
    let mut c = redis.conn();
    let mut config: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("*").query(&mut c).unwrap();
    config.sort();
    let mut acl: Vec<String> = redis::cmd("ACL").arg("LIST").query(&mut c).unwrap();
    acl.sort();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    keys.sort();
    let values = keys
        .into_iter()
        .map(|k| {
            let d: Vec<String> = redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(&k).query(&mut c).unwrap();
            (k, d.concat())
        })
        .collect();
    Snapshot {
        values,
        digest: redis::cmd("DEBUG").arg("DIGEST").query(&mut c).unwrap(),
        dbsize: redis::cmd("DBSIZE").query(&mut c).unwrap(),
        config,
        acl,
        functions: redis::cmd("FUNCTION").arg("DUMP").query(&mut c).unwrap(),
        slowlog_len: redis::cmd("SLOWLOG").arg("LEN").query(&mut c).unwrap(),
    }
}

fn seed(redis: &RedisServer) {
    let mut c = redis.conn();
    let cmds: &[&[&str]] = &[
        &["SET", "s", "10"],
        &["HSET", "h", "f", "1", "g", "2"],
        &["RPUSH", "l", "a", "b", "c"],
        &["SADD", "st", "a", "b"],
        &["ZADD", "z", "1", "a", "2", "b"],
        &["XADD", "x", "1-1", "f", "v"],
        &["XGROUP", "CREATE", "x", "g", "0"],
        // Not counted yet: PFCOUNT would store the cardinality in the value's header (a write
        // Redis replicates), so the read-only token may not run it.
        &["PFADD", "hll", "a", "b"],
        &["GEOADD", "geo", "13.36", "38.11", "p"],
        // Every command is logged, so a SLOWLOG RESET would show.
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        &["CONFIG", "SET", "slowlog-max-len", "1000000"],
    ];
    for a in cmds {
        let mut cmd = redis::cmd(a[0]);
        for x in &a[1..] {
            cmd.arg(*x);
        }
        let _: R = cmd.query(&mut c).unwrap();
    }
    let lib = "#!lua name=rclib\n\
        redis.register_function('rc_w', function(keys, args) return redis.call(unpack(args)) end)\n\
        redis.register_function{function_name='rc_r', callback=function(keys, args) return redis.call(unpack(args)) end, flags={'no-writes'}}";
    let _: R = redis::cmd("FUNCTION").arg("LOAD").arg(lib).query(&mut c).unwrap();
}

/// A server whose DEBUG works from loopback: DEBUG DIGEST for the tests, and a real target
/// should the boundary fail.
fn debuggable() -> RedisServer {
    RedisServer::start_with(&["--enable-debug-command", "local"])
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn send(&self, token: &str, path: &str, body: Option<Value>, base64: bool) -> (u16, Value) {
        let mut r = if let Some(b) = body {
            self.http.post(format!("{}{path}", self.url)).body(b.to_string())
        } else {
            self.http.get(format!("{}{path}", self.url))
        };
        r = r.bearer_auth(token);
        if base64 {
            r = r.header("Upstash-Encoding", "base64");
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        // A subscription (path style /subscribe/…) answers an event stream that does not end:
        // its status says what happened; it changes nothing.
        let streaming = resp.headers().get("content-type").is_some_and(|v| v == "text/event-stream");
        if streaming {
            return (status, Value::String("event stream".into()));
        }
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn path_of(words: &[String]) -> String {
    words.iter().map(|w| format!("/{w}")).collect()
}

const KEYS: [&str; 10] = ["s", "h", "l", "st", "z", "x", "hll", "geo", "missing", "{s}2"];

#[tokio::test]
async fn the_readonly_token_changes_nothing_by_any_way_in() {
    let redis = debuggable();
    seed(&redis);
    let front = Front::start(&redis.url(), false);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let table = entries(&redis);
    let ro = &front.readonly_token;

    // A full-token client loads scripts first (the read-only token may run only those), the
    // flagged one by the front's rewrite.
    let generic = "return redis.call(unpack(ARGV))";
    let flagged = format!("#!lua flags=allow-key-locking\n{generic}");
    let no_writes = format!("#!lua flags=no-writes\n{generic}");
    let mut shas = Vec::new();
    let load = |src: String| {
        let c = &c;
        let token = &front.token;
        async move {
            let (s, v) = c.send(token, "/", Some(json!(["SCRIPT", "LOAD", src])), false).await;
            assert_eq!(s, 200, "{v}");
            v["result"].as_str().unwrap().to_string()
        }
    };
    for src in [generic.to_string(), flagged.clone(), no_writes.clone()] {
        shas.push(load(src).await);
    }
    let (s, v) = c.send(&front.token, "/", Some(json!(["EVALSHA", shas[1], "1", "s", "GET", "s"])), false).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("10")), "{v}");

    let before = snapshot(&redis);
    let mut sent = 0usize;
    let mut refused = 0usize;
    let mut tally = |status: u16| {
        sent += 1;
        if status == 403 {
            refused += 1;
        }
    };

    // Every command and subcommand, with each key type, by every way in and both encodings.
    let mut all: Vec<Vec<String>> = Vec::new();
    for e in &table {
        for key in KEYS {
            all.extend(argument_lists(e, key, "1"));
        }
        all.extend(argument_lists(e, "s", "s"));
    }
    for (i, words) in all.iter().enumerate() {
        let b64 = i % 2 == 0;
        let (s, _) = c.send(ro, "/", Some(json!(words)), b64).await;
        tally(s);
        let (s, _) = c.send(ro, &path_of(words), None, !b64).await;
        tally(s);
    }
    for chunk in all.chunks(32) {
        let (s, _) = c.send(ro, "/pipeline", Some(json!(chunk)), false).await;
        tally(s);
        let (s, _) = c.send(ro, "/multi-exec", Some(json!(chunk)), true).await;
        tally(s);
    }

    // Scripts that write or administer, by every scripting way in a read-only token has.
    let mut scripted: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for e in table.iter().filter(|e| !e.flags.iter().any(|f| f == "readonly") || e.flags.iter().any(|f| f == "write")) {
        for words in argument_lists(e, "s", "1") {
            let keys = if e.first > 0 { vec!["s".to_string()] } else { vec![] };
            scripted.push((keys, words));
        }
    }
    // The attack first seen: Redis refuses the script (bad numkeys), then EVALSHA_RO.
    let flushall = "#!lua flags=allow-key-locking\nreturn redis.call('flushall')";
    let (s, _) = c.send(ro, "/", Some(json!(["EVAL_RO", flushall, "5", "k"])), false).await;
    tally(s);
    let flushall_sha = redcount_core::sha1::hex(redcount_core::sha1::digest(flushall.as_bytes()));
    let flushall_sha = String::from_utf8(flushall_sha.to_vec()).unwrap();
    for round in 0..3 {
        if round == 1 {
            // Redis loses its scripts; the front still knows the rewrites.
            let _: R = redis::cmd("SCRIPT").arg("FLUSH").query(&mut redis.conn()).unwrap();
        }
        if round == 2 {
            // Loaded again by the full token, through the front (which learns again).
            for src in [generic.to_string(), flagged.clone(), no_writes.clone()] {
                load(src).await;
            }
        }
        let (s, _) = c.send(ro, "/", Some(json!(["EVALSHA_RO", flushall_sha, "1", "k"])), false).await;
        tally(s);
        for (keys, words) in &scripted {
            let mut tail: Vec<String> = vec![keys.len().to_string()];
            tail.extend(keys.iter().cloned());
            tail.extend(words.iter().cloned());
            let ways: Vec<Vec<String>> = vec![
                [vec!["EVAL_RO".to_string(), generic.to_string()], tail.clone()].concat(),
                [vec!["EVAL_RO".to_string(), flagged.clone()], tail.clone()].concat(),
                [vec!["EVAL_RO".to_string(), no_writes.clone()], tail.clone()].concat(),
                [vec!["EVALSHA_RO".to_string(), shas[0].clone()], tail.clone()].concat(),
                [vec!["EVALSHA_RO".to_string(), shas[1].clone()], tail.clone()].concat(),
                [vec!["FCALL_RO".to_string(), "rc_w".to_string()], tail.clone()].concat(),
                [vec!["FCALL_RO".to_string(), "rc_r".to_string()], tail.clone()].concat(),
            ];
            for (i, way) in ways.iter().enumerate() {
                let (s, _) = c.send(ro, "/", Some(json!(way)), i % 2 == 0).await;
                tally(s);
            }
            let (s, _) = c.send(ro, "/pipeline", Some(json!(ways)), true).await;
            tally(s);
        }
    }

    let after = snapshot(&redis);
    println!("{sent} requests, {refused} refused by the front with 403");
    assert_eq!(before.values, after.values, "the data changed");
    assert_eq!(before.digest, after.digest, "the data changed");
    assert_eq!(before.dbsize, after.dbsize);
    assert_eq!(before.config, after.config, "the configuration changed");
    assert_eq!(before.acl, after.acl, "the ACL users changed");
    assert_eq!(before.functions, after.functions, "the function libraries changed");
    assert!(after.slowlog_len >= before.slowlog_len, "the slow log was reset");
    assert!(refused > 1000, "the front refused {refused}: the cases reached it");
    // The rewrite of a script Redis refused was never learned.
    let (s, v) = c.send(&front.token, "/", Some(json!(["SCRIPT", "EXISTS", flushall_sha])), false).await;
    assert_eq!((s, v["result"].clone()), (200, json!([0])), "{v}");
}

/// A read-only token runs only scripts a full-token client loaded: Lua no one vetted could
/// hold Redis inside one C call (a pattern match, `string.rep`) where SCRIPT KILL cannot
/// reach, grow Lua's memory without bound, or fill the script cache.
#[tokio::test]
async fn the_readonly_token_runs_only_scripts_the_full_token_loaded() {
    let redis = RedisServer::start();
    let front = Front::start(&redis.url(), false);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let ro = &front.readonly_token;
    let cached = |sha: &str| -> i64 {
        let v: Vec<i64> = redis::cmd("SCRIPT").arg("EXISTS").arg(sha).query(&mut redis.conn()).unwrap();
        v[0]
    };
    let sha = |src: &str| {
        String::from_utf8(redcount_core::sha1::hex(redcount_core::sha1::digest(src.as_bytes())).to_vec()).unwrap()
    };
    // The shape of the attack, kept small: a backtracking match in one C call.
    let bomb = "local s = string.rep('a', 24) return string.find(s, '.-.-.-b') or 0";
    let echo = "return ARGV[1]";
    let flagged = "#!lua flags=allow-key-locking,no-writes\nreturn ARGV[1] .. '!'";
    for src in [bomb, echo, flagged] {
        for base64 in [false, true] {
            let (s, v) = c.send(ro, "/", Some(json!(["EVAL_RO", src, "0", "x"])), base64).await;
            assert_eq!(s, 403, "{src}: {v}");
            assert!(v["error"].as_str().unwrap().contains("SCRIPT LOAD"), "{v}");
        }
        // In a pipeline that entry alone is refused; in a transaction, the whole.
        let (s, v) =
            c.send(ro, "/pipeline", Some(json!([["PING"], ["EVAL_RO", src, "0", "x"], ["PING"]])), false).await;
        assert_eq!(s, 200, "{src} in a pipeline: {v}");
        assert_eq!((v[0]["result"].as_str(), v[2]["result"].as_str()), (Some("PONG"), Some("PONG")), "{v}");
        assert!(v[1]["error"].as_str().is_some_and(|e| e.contains("SCRIPT LOAD")), "{v}");
        let (s, v) = c.send(ro, "/multi-exec", Some(json!([["GET", "k"], ["EVAL_RO", src, "0", "x"]])), false).await;
        assert_eq!(s, 403, "{src} in a transaction: {v}");
    }
    assert_eq!((cached(&sha(bomb)), cached(&sha(echo))), (0, 0), "Redis's script cache was filled");
    // Once the full token has loaded them, the read-only token runs them by source or SHA.
    for src in [echo, flagged] {
        let (s, v) = c.send(&front.token, "/", Some(json!(["SCRIPT", "LOAD", src])), false).await;
        assert_eq!((s, v["result"].as_str()), (200, Some(sha(src).as_str())), "{v}");
    }
    let (s, v) = c.send(ro, "/", Some(json!(["EVAL_RO", echo, "0", "x"])), false).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("x")), "{v}");
    let (s, v) = c.send(ro, "/", Some(json!(["EVAL_RO", flagged, "0", "x"])), false).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("x!")), "{v}");
    let (s, v) = c.send(ro, "/", Some(json!(["EVALSHA_RO", sha(flagged), "0", "y"])), false).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("y!")), "{v}");
    let (s, v) = c
        .send(ro, "/pipeline", Some(json!([["EVAL_RO", echo, "0", "a"], ["EVALSHA_RO", sha(echo), "0", "b"]])), false)
        .await;
    assert_eq!((s, v[0]["result"].as_str(), v[1]["result"].as_str()), (200, Some("a"), Some("b")), "{v}");
    // After Redis lost them the read-only token does not bring them back.
    let _: R = redis::cmd("SCRIPT").arg("FLUSH").query(&mut redis.conn()).unwrap();
    let (s, v) = c.send(ro, "/", Some(json!(["EVALSHA_RO", sha(flagged), "0", "y"])), false).await;
    assert!(s == 400 && v["error"].as_str().unwrap().starts_with("NOSCRIPT"), "{s} {v}");
    let (s, v) = c.send(ro, "/", Some(json!(["EVAL_RO", echo, "0", "x"])), false).await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(cached(&sha(echo)), 0);
    // PFCOUNT writes the cardinality it computed into the value: not for this token.
    let _: R = redis::cmd("PFADD").arg("hll").arg("a").query(&mut redis.conn()).unwrap();
    let (s, v) = c.send(ro, "/", Some(json!(["PFCOUNT", "hll"])), false).await;
    assert_eq!(s, 403, "{v}");
}

/// Every read of the whole keyspace (a key name, or their number) the read-only token may not
/// run, from the `COMMAND` table: keyless `@keyspace` reads (KEYS, SCAN, RANDOMKEY, DBSIZE), and
/// those the table does not flag, naming or counting any key of a slot or database.
fn walks_the_keyspace(e: &Entry) -> bool {
    let name = e.words.join("|");
    (e.keyless && e.categories.iter().any(|c| c == "@keyspace") && e.flags.iter().any(|f| f == "readonly"))
        || ["cluster|getkeysinslot", "cluster|countkeysinslot", "cluster|slot-stats", "memory|stats"]
            .contains(&name.as_str())
}

#[tokio::test]
async fn the_readonly_token_may_not_walk_the_keyspace() {
    let redis = RedisServer::start();
    let front = Front::start(&redis.url(), false);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut redis.conn()).unwrap();
    for cmd in [
        json!(["KEYS", "*"]),
        json!(["SCAN", "0"]),
        json!(["scan", "0", "MATCH", "*"]),
        json!(["RANDOMKEY"]),
        json!(["randomkey"]),
        json!(["DBSIZE"]),
    ] {
        let (s, v) = c.send(&front.readonly_token, "/", Some(cmd.clone()), false).await;
        assert_eq!(s, 403, "{cmd}: {v}");
        assert!(v["error"].as_str().unwrap().contains("read-only"), "{v}");
        let (s, v) = c.send(&front.readonly_token, "/pipeline", Some(json!([cmd.clone()])), false).await;
        assert!(s == 200 && v[0]["error"].as_str().is_some_and(|e| e.contains("read-only")), "{cmd} piped: {v}");
        let (s, _) = c.send(&front.token, "/", Some(cmd), false).await;
        assert_eq!(s, 200);
    }
    // Every such read of the table, inside a script the full token loaded: its Redis user may not.
    let generic = "return redis.call(unpack(ARGV))";
    let (s, _) = c.send(&front.token, "/", Some(json!(["SCRIPT", "LOAD", generic])), false).await;
    assert_eq!(s, 200);
    let walks: Vec<Vec<String>> =
        entries(&redis).iter().filter(|e| walks_the_keyspace(e)).flat_map(|e| argument_lists(e, "k", "0")).collect();
    let names: Vec<String> = walks.iter().map(|w| w.join(" ")).collect();
    for must in ["keys", "scan", "randomkey", "dbsize", "cluster", "memory stats"] {
        assert!(names.iter().any(|n| n.starts_with(must)), "{must} is among the walks: {names:?}");
    }
    for words in &walks {
        let way = [vec!["EVAL_RO".to_string(), generic.to_string(), "0".into()], words.clone()].concat();
        let (s, v) = c.send(&front.readonly_token, "/", Some(json!(way)), false).await;
        let e = v["error"].as_str().unwrap_or_default();
        assert!(
            s == 400 && (e.contains("can't run this command") || e.contains("no permissions")),
            "{words:?} in a read-only script: {s} {v}"
        );
    }
    // Inside a script too (one the full token loaded): the read-only connections log in as
    // a user without them.
    let (s, _) =
        c.send(&front.token, "/", Some(json!(["SCRIPT", "LOAD", "return redis.call('keys', '*')"])), false).await;
    assert_eq!(s, 200);
    let (s, v) = c
        .send(&front.readonly_token, "/", Some(json!(["EVAL_RO", "return redis.call('keys', '*')", "0"])), false)
        .await;
    assert_eq!(s, 400, "{v}");
    // A lower-case scheme is still a bearer token (RFC 7235).
    let r = redcount_tests::http()
        .post(front.url())
        .header("Authorization", format!("bearer {}", front.token))
        .body(r#"["PING"]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test]
async fn administrative_commands_need_a_flag() {
    let redis = debuggable();
    seed(&redis);
    let front = Front::start(&redis.url(), false);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let table = entries(&redis);
    let before = snapshot(&redis);
    let mut n = 0;
    let mut scripted = 0;
    for e in table.iter().filter(|e| e.is_admin()) {
        for words in argument_lists(e, "s", "1") {
            // Inside a script, by EVAL and FCALL: the front's own Redis user may not.
            let keys: Vec<&str> = if e.first > 0 { vec!["1", "s"] } else { vec!["0"] };
            let tail: Vec<&str> = keys.iter().copied().chain(words.iter().map(String::as_str)).collect();
            for way in [
                [vec!["EVAL", "return redis.call(unpack(ARGV))"], tail.clone()].concat(),
                [vec!["FCALL", "rc_w"], tail.clone()].concat(),
            ] {
                let (s, v) = c.send(&front.token, "/", Some(json!(way)), false).await;
                assert_ne!(s, 200, "{way:?} ran inside a script: {v}");
                scripted += 1;
            }
            for path in ["/", "/pipeline", "/multi-exec"] {
                let body = if path == "/" { json!(words) } else { json!([words]) };
                let (s, v) = c.send(&front.token, path, Some(body), false).await;
                // In a pipeline each entry is refused alone (the pipeline answers 200).
                let (s, why) = match path {
                    "/pipeline" if s == 200 => {
                        let why = v[0]["error"].as_str().unwrap_or_default();
                        (if why.contains("--allow-admin-commands") { 403 } else { 400 }, why)
                    }
                    _ => (s, v["error"].as_str().unwrap_or_default()),
                };
                // Refused as administration, or earlier as unable to run over REST at all.
                assert!(
                    (s == 403 && why.contains("--allow-admin-commands"))
                        || (s == 400 && why.contains("not available over REST")),
                    "{words:?} via {path}: {s} {v}"
                );
                n += 1;
            }
        }
    }
    assert!(n > 100 && scripted > 100, "{n} admin cases, {scripted} inside scripts");
    for words in [
        json!(["SHUTDOWN", "NOSAVE"]),
        json!(["DEBUG", "SLEEP", "0"]),
        json!(["CONFIG", "SET", "maxmemory", "1"]),
        json!(["MIGRATE", "127.0.0.1", "1", "s", "0", "100"]),
        json!(["ROLE"]),
        json!(["LASTSAVE"]),
    ] {
        let (s, v) = c.send(&front.token, "/", Some(words.clone()), false).await;
        assert_eq!(s, 403, "{words}: {v}");
    }
    // The script debugger holds the connection (SYNC: all of Redis), by any way in.
    for mode in ["YES", "SYNC", "sync"] {
        for way in [
            json!(["SCRIPT", "DEBUG", mode]),
            json!(["EVAL", "return redis.call('script','debug',ARGV[1])", "0", mode]),
        ] {
            let (s, v) = c.send(&front.token, "/", Some(way.clone()), false).await;
            assert_eq!(s, 400, "{way}: {v}");
        }
    }
    let (s, v) = c.send(&front.token, "/", Some(json!(["PING"])), false).await;
    assert_eq!((s, v["result"].as_str()), (200, Some("PONG")), "{v}");
    let after = snapshot(&redis);
    assert!(after.slowlog_len >= before.slowlog_len, "the slow log was reset");
    assert_eq!(before, Snapshot { slowlog_len: before.slowlog_len, ..after });
    drop(front);

    let front = Front::start_with(&redis.url(), false, &["--allow-admin-commands"]);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let (s, v) = c.send(&front.token, "/", Some(json!(["CONFIG", "SET", "maxmemory-samples", "7"])), false).await;
    assert_eq!(s, 200, "{v}");
    let got: Vec<String> = redis::cmd("CONFIG").arg("GET").arg("maxmemory-samples").query(&mut redis.conn()).unwrap();
    assert_eq!(got[1], "7");
}

/// The same boundary with the front on a 3-master Cluster (`--cluster`): commands and scripts
/// are routed to every node by their keys, and each node's ACL users (made by the front on
/// every node) must refuse what the front lets through. Every command and subcommand of the
/// `COMMAND` table by the read-only token, directly and inside scripts; every administrative
/// one inside EVAL and FCALL by the full token; on every node nothing changes, and the
/// cluster keeps every slot.
#[tokio::test]
async fn the_boundary_holds_on_a_cluster() {
    let cluster = redcount_tests::RedisCluster::start_with(3, &["--enable-debug-command", "local"]);
    // One hash tag per node, and the seeded keys under it.
    let mut tags = Vec::new();
    for node in &cluster.nodes {
        let mut c = node.conn();
        let tag = (0..)
            .map(|i| format!("{{t{i}}}"))
            .find(|t| redis::cmd("SET").arg(format!("{t}s")).arg("10").query::<()>(&mut c).is_ok())
            .unwrap();
        let cmds: Vec<Vec<String>> = vec![
            vec!["HSET".into(), format!("{tag}h"), "f".into(), "1".into()],
            vec!["RPUSH".into(), format!("{tag}l"), "a".into(), "b".into()],
            vec!["SADD".into(), format!("{tag}st"), "a".into()],
            vec!["ZADD".into(), format!("{tag}z"), "1".into(), "a".into()],
            vec!["PFADD".into(), format!("{tag}hll"), "a".into()],
            vec!["CONFIG".into(), "SET".into(), "slowlog-log-slower-than".into(), "0".into()],
            vec!["CONFIG".into(), "SET".into(), "slowlog-max-len".into(), "1000000".into()],
        ];
        for a in cmds {
            let _: R = redis::cmd(&a[0]).arg(&a[1..]).query(&mut c).unwrap();
        }
        let lib = "#!lua name=rclib\n\
            redis.register_function('rc_w', function(keys, args) return redis.call(unpack(args)) end)";
        let _: R = redis::cmd("FUNCTION").arg("LOAD").arg(lib).query(&mut c).unwrap();
        tags.push(tag);
    }
    let front = Front::start(&cluster.urls(), true);
    let c = Client { http: redcount_tests::http(), url: front.url() };
    let table = entries(&cluster.nodes[0]);
    let ro = &front.readonly_token;
    let generic = "return redis.call(unpack(ARGV))";
    let flagged = format!("#!lua flags=allow-key-locking\n{generic}");
    let mut shas = Vec::new();
    for src in [generic.to_string(), flagged.clone()] {
        let (s, v) = c.send(&front.token, "/", Some(json!(["SCRIPT", "LOAD", src])), false).await;
        assert_eq!(s, 200, "{v}");
        shas.push(v["result"].as_str().unwrap().to_string());
    }
    for tag in &tags {
        // Loaded on every node, and the full token may write through them.
        let key = format!("{tag}s");
        let (s, v) = c.send(&front.token, "/", Some(json!(["EVALSHA", shas[1], "1", key, "GET", key])), false).await;
        assert_eq!((s, v["result"].as_str()), (200, Some("10")), "{v}");
    }
    let before: Vec<Snapshot> = cluster.nodes.iter().map(snapshot).collect();
    let mut sent = 0usize;

    for tag in &tags {
        let key = format!("{tag}s");
        let mut all: Vec<Vec<String>> = Vec::new();
        for e in &table {
            all.extend(argument_lists(e, &key, "1"));
        }
        for (i, words) in all.iter().enumerate() {
            c.send(ro, "/", Some(json!(words)), i % 2 == 0).await;
            sent += 1;
        }
        for chunk in all.chunks(32) {
            c.send(ro, "/pipeline", Some(json!(chunk)), false).await;
            sent += 1;
        }
        for e in
            table.iter().filter(|e| !e.flags.iter().any(|f| f == "readonly") || e.flags.iter().any(|f| f == "write"))
        {
            for words in argument_lists(e, &key, "1") {
                let tail: Vec<String> = ["1".to_string(), key.clone()].into_iter().chain(words).collect();
                for way in [
                    [vec!["EVAL_RO".to_string(), generic.to_string()], tail.clone()].concat(),
                    [vec!["EVAL_RO".to_string(), flagged.clone()], tail.clone()].concat(),
                    [vec!["EVALSHA_RO".to_string(), shas[0].clone()], tail.clone()].concat(),
                    [vec!["EVALSHA_RO".to_string(), shas[1].clone()], tail.clone()].concat(),
                    [vec!["FCALL_RO".to_string(), "rc_w".to_string()], tail.clone()].concat(),
                ] {
                    c.send(ro, "/", Some(json!(way)), false).await;
                    sent += 1;
                }
            }
        }
        // The full token, administration inside scripts on this node (CLUSTER RESET,
        // DELSLOTSRANGE, FORGET, SETSLOT...; CONFIG SET; SLOWLOG RESET).
        for e in table.iter().filter(|e| e.is_admin()) {
            for words in argument_lists(e, &key, "1") {
                let tail: Vec<String> = ["1".to_string(), key.clone()].into_iter().chain(words).collect();
                for way in [
                    [vec!["EVAL".to_string(), generic.to_string()], tail.clone()].concat(),
                    [vec!["FCALL".to_string(), "rc_w".to_string()], tail.clone()].concat(),
                ] {
                    let (s, v) = c.send(&front.token, "/", Some(json!(way)), false).await;
                    assert_ne!(s, 200, "{way:?} ran inside a script: {v}");
                    sent += 1;
                }
            }
        }
    }
    let after: Vec<Snapshot> = cluster.nodes.iter().map(snapshot).collect();
    println!("{sent} requests over {} nodes", tags.len());
    assert!(sent > 3000, "{sent}");
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b.values, a.values, "node {i}: the data changed");
        assert_eq!((&b.digest, b.dbsize), (&a.digest, a.dbsize), "node {i}: the data changed");
        assert_eq!(b.config, a.config, "node {i}: the configuration changed");
        assert_eq!(b.acl, a.acl, "node {i}: the ACL users changed");
        assert_eq!(b.functions, a.functions, "node {i}: the function libraries changed");
        assert!(a.slowlog_len >= b.slowlog_len, "node {i}: the slow log was reset");
    }
    for node in &cluster.nodes {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut node.conn()).unwrap();
        assert!(info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384"), "{info}");
    }
}
