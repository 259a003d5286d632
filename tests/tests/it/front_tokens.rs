//! `redcount-rest --tokens FILE`: several apps on one front, each token logged in to Redis as
//! its own ACL user, so Redis itself enforces its key patterns; read-only tokens also get the
//! front's rules; unknown tokens 401; SIGHUP reloads the file (a bad file keeps the tokens in
//! force); no token reaches the log.

use std::process::Command;
use std::time::Duration;

use redcount_tests::{Front, RedisServer, RestFront, error_code, mentions, scratch_dir, secret};
use serde_json::{Value, json};

async fn post(url: &str, token: &str, body: Value) -> (u16, Value) {
    let r =
        redcount_tests::http().post(format!("{url}/")).bearer_auth(token).body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

/// A subscription of `token` to `channel` through the front at `url`, its first event (Redis's
/// confirmation) read.
async fn subscribed(url: &str, token: &str, channel: &str) -> reqwest::Response {
    let mut sub = redcount_tests::http()
        .post(format!("{url}/subscribe/{channel}"))
        .bearer_auth(token)
        .header("Accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(sub.status().as_u16(), 200);
    let first = tokio::time::timeout(Duration::from_secs(5), sub.chunk()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains(&format!("subscribe,{channel},1")));
    sub
}

fn acl(redis: &RedisServer, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for r in rules {
        cmd.arg(*r);
    }
    let _: () = cmd.query(&mut redis.conn()).unwrap();
}

pub(super) fn write_tokens(path: &std::path::Path, entries: &[(&str, &str, &str, bool)]) {
    let v: Vec<Value> = entries
        .iter()
        .map(|(token, user, password, readonly)| json!({"token": token, "user": user, "password": password, "readonly": readonly}))
        .collect();
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scoped_tokens_are_held_to_their_redis_users() {
    let redis = RedisServer::start();
    acl(&redis, &["app1", "on", ">pw-app1-0123456789", "~app1:*", "+@all", "-@admin"]);
    acl(&redis, &["app2", "on", ">pw-app2-0123456789", "~app2:*", "+@all", "-@admin"]);
    let (t1, t2, t3, t4) = (secret("t1"), secret("t2"), secret("t3"), secret("t4"));
    let dir = scratch_dir("tokens");
    let file = dir.join("tokens.json");
    write_tokens(
        &file,
        &[
            (&t1, "app1", "pw-app1-0123456789", false),
            (&t2, "app2", "pw-app2-0123456789", false),
            (&t3, "app1", "pw-app1-0123456789", true),
        ],
    );
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();

    // Each token writes its own keys; Redis refuses the other app's (NOPERM, as a 4xx).
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await, (200, json!({"result": "OK"})));
    assert_eq!(post(&url, &t2, json!(["SET", "app2:x", "2"])).await, (200, json!({"result": "OK"})));
    for (token, cmd) in [
        (&t1, json!(["SET", "app2:x", "stolen"])),
        (&t2, json!(["GET", "app1:x"])),
        (&t1, json!(["EVAL", "return redis.call('GET', KEYS[1])", "1", "app2:x"])),
    ] {
        let (status, v) = post(&url, token, cmd.clone()).await;
        assert!((400..500).contains(&status), "{cmd}: {status} {v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains("NOPERM") || e.contains("permission")), "{cmd}: {v}");
    }
    // Commands that reach every app's keys at once are refused to a file token, whatever its
    // ACL user may do (docs/front.md's example user may run them).
    for cmd in [
        json!(["FLUSHALL"]),
        json!(["FLUSHDB"]),
        json!(["SCRIPT", "FLUSH"]),
        json!(["FUNCTION", "FLUSH"]),
        json!(["KEYS", "*"]),
        json!(["SCAN", "0"]),
        json!(["RANDOMKEY"]),
    ] {
        let (status, v) = post(&url, &t1, cmd.clone()).await;
        assert_eq!(status, 403, "{cmd}: {v}");
    }
    let got: String = redis::cmd("GET").arg("app2:x").query(&mut redis.conn()).unwrap();
    assert_eq!(got, "2", "app2's key is untouched");
    // A read-only token reads its user's keys and may not write them (the front's rule).
    assert_eq!(post(&url, &t3, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
    let (status, v) = post(&url, &t3, json!(["SET", "app1:y", "1"])).await;
    assert_eq!(status, 403, "{v}");
    // The simple tokens still work beside the file; an unknown token is 401.
    assert_eq!(post(&url, &front.token, json!(["GET", "app2:x"])).await, (200, json!({"result": "2"})));
    assert_eq!(post(&url, &t4, json!(["PING"])).await.0, 401);
    assert_eq!(post(&url, &format!("{t1}x"), json!(["PING"])).await.0, 401);

    // SIGHUP: t2 removed, t4 added; a token of a changed password logs in anew.
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false), (&t4, "app2", "pw-app2-0123456789", true)]);
    let hup = |pid: u32| assert!(Command::new("kill").args(["-HUP", &pid.to_string()]).status().unwrap().success());
    hup(front.pid());
    let mut reloaded = false;
    for _ in 0..50 {
        if post(&url, &t4, json!(["GET", "app2:x"])).await == (200, json!({"result": "2"})) {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "t4 works after SIGHUP\n{}", front.log());
    assert_eq!(post(&url, &t2, json!(["PING"])).await.0, 401, "t2 was removed");
    assert_eq!(post(&url, &t1, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
    // A file naming a user that cannot log in is refused whole: the tokens in force stay.
    write_tokens(&file, &[(&t1, "app1", "wrong-password-0123", false)]);
    hup(front.pid());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(post(&url, &t4, json!(["GET", "app2:x"])).await, (200, json!({"result": "2"})), "{}", front.log());
    assert!(front.log().contains("not reloaded"), "{}", front.log());
    // No token and no password in the log.
    let log = front.log();
    for s in [&t1, &t2, &t3, &t4, &"pw-app1-0123456789".to_string(), &"wrong-password-0123".to_string()] {
        assert!(!log.contains(s.as_str()), "a secret in the log:\n{log}");
    }

    // At start, a bad file stops the front with a message naming the entry, not the token.
    let main = secret("main");
    for (content, want) in [
        (json!([{"token": "short", "user": "app1", "password": "x"}]).to_string(), "at least 16"),
        (json!([{"token": t1, "user": "nobody", "password": "x"}]).to_string(), "cannot log in"),
        (json!([{"token": main, "user": "app1", "password": "pw-app1-0123456789"}]).to_string(), "used twice"),
        (json!([{"token": t1, "user": "app1", "password": "p", "extra": 1}]).to_string(), "unknown field"),
        (json!([{"token": t1, "user": "default", "password": "x"}]).to_string(), "the front's own"),
    ] {
        let bad = dir.join("bad.json");
        std::fs::write(&bad, &content).unwrap();
        let mut child = Command::new(redcount_tests::bin("redcount-rest"))
            .args(["--listen", "127.0.0.1:0", "--redis", &redis.url(), "--tokens", bad.to_str().unwrap()])
            .env("REDCOUNT_REST_TOKEN", &main)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // It must stop by itself; one that started is killed after 10 s (and fails below).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{content}: started");
        assert!(err.contains(want), "{content}: {err}");
        assert!(!err.contains(&t1), "the token is printed: {err}");
    }
}

/// A token removed from the file by SIGHUP loses what it holds: its open subscriptions end
/// and its Redis connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_token_loses_its_subscriptions_and_connections() {
    let redis = RedisServer::start();
    acl(&redis, &["app1", "on", ">pw-app1-0123456789", "~app1:*", "&app1:*", "+@all", "-@admin"]);
    acl(&redis, &["app2", "on", ">pw-app2-0123456789", "~app2:*", "&app2:*", "+@all", "-@admin"]);
    let (t1, t2) = (secret("t1"), secret("t2"));
    let file = scratch_dir("tokens-revoke").join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false), (&t2, "app2", "pw-app2-0123456789", false)]);
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();
    let clients_of = |user: &str| connections_of(&redis, user);
    assert_eq!(post(&url, &t2, json!(["SET", "app2:x", "1"])).await, (200, json!({"result": "OK"})));
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await, (200, json!({"result": "OK"})));
    let mut sub = subscribed(&url, &t2, "app2:news").await;
    assert!(clients_of("app2") >= 2, "a pooled connection and the subscriber's");

    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false)]);
    assert!(Command::new("kill").args(["-HUP", &front.pid().to_string()]).status().unwrap().success());
    let mut revoked = false;
    for _ in 0..50 {
        if post(&url, &t2, json!(["PING"])).await.0 == 401 {
            revoked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(revoked, "t2 is refused after SIGHUP\n{}", front.log());
    // The stream ends (a comment may say why first).
    let ended =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = sub.chunk().await {} }).await;
    assert!(ended.is_ok(), "the removed token's subscription is still open");
    let mut gone = false;
    for _ in 0..50 {
        if clients_of("app2") == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{} connections of the removed token's user remain", clients_of("app2"));
    assert!(clients_of("app1") >= 1, "the other token keeps its connections");
    assert_eq!(post(&url, &t1, json!(["GET", "app1:x"])).await, (200, json!({"result": "1"})));
}

/// docs/front.md's example user for a `--tokens` app, exactly as written there (`ACL SETUSER app1
/// on >… <rules>`): its rules, with `app1` replaced by `name`.
fn readme_user_rules(name: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(redcount_tests::root().join("docs/front.md")).unwrap();
    let start = readme.find("`ACL SETUSER app1 on >… ").expect("docs/front.md's example --tokens user");
    let rest = &readme[start + "`ACL SETUSER app1 on >… ".len()..];
    let rules = &rest[..rest.find('`').unwrap()];
    rules.split(' ').map(|r| r.replace("app1", name)).collect()
}

/// The names (`cmd` or `cmd|sub`) of the commands COMMAND DOCS documents with an argument that
/// names a database (`db`, `destination-db`): they reach another database than the front's.
fn naming_a_database(redis: &RedisServer) -> std::collections::HashSet<String> {
    use redis::Value as R;
    fn text(v: &R) -> String {
        match v {
            R::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
            R::SimpleString(s) => s.to_lowercase(),
            _ => String::new(),
        }
    }
    fn pairs(v: &R) -> Vec<(String, &R)> {
        match v {
            R::Array(a) => a.chunks(2).filter(|c| c.len() == 2).map(|c| (text(&c[0]), &c[1])).collect(),
            R::Map(m) => m.iter().map(|(k, v)| (text(k), v)).collect(),
            _ => vec![],
        }
    }
    fn names_db(args: &R) -> bool {
        let R::Array(list) = args else { return false };
        list.iter().any(|a| {
            pairs(a).iter().any(|(k, v)| {
                (k == "name" && (text(v) == "db" || text(v).ends_with("-db"))) || (k == "arguments" && names_db(v))
            })
        })
    }
    fn walk(name: &str, doc: &R, out: &mut std::collections::HashSet<String>) {
        for (k, v) in pairs(doc) {
            if k == "arguments" && names_db(v) {
                out.insert(name.to_string());
            }
            if k == "subcommands" {
                for (sub, d) in pairs(v) {
                    walk(&sub, d, out);
                }
            }
        }
    }
    let docs: R = redis::cmd("COMMAND").arg("DOCS").query(&mut redis.conn()).unwrap();
    let mut out = std::collections::HashSet::new();
    for (name, doc) in pairs(&docs) {
        walk(&name, doc, &mut out);
    }
    assert!(out.contains("move"), "COMMAND DOCS names MOVE's database: {out:?}");
    out
}

/// What one app's token must not run, from Redis's `COMMAND` table, and why: commands that name
/// no key yet reach every key or the whole server (reads and writes of `@keyspace`, `@dangerous`, or
/// administration), that replace every app's functions (`@scripting` writes naming no key), that
/// name another database (an argument `db` in COMMAND DOCS, SELECT, SWAPDB) or another server
/// (an argument `host`: MIGRATE); that load a payload Redis may not check (RESTORE, RESTORE-ASKING:
/// a crafted one crashes Redis); and every subcommand of the containers whose state every app
/// shares but those an app may run (its own key, help): PUBSUB (every app's channels), FUNCTION
/// (every app's functions), SCRIPT (another app's running script, every app's cache), MEMORY (the
/// server's), CLUSTER (any app's keys of a slot; the topology stays readable).
fn beyond_one_app(
    e: &super::front_trust::Entry,
    databases: &std::collections::HashSet<String>,
) -> Option<&'static str> {
    let name = e.words.join("|");
    let cat = |c: &str| e.categories.iter().any(|x| x == c);
    let data = e.flags.iter().any(|f| f == "readonly" || f == "write");
    let shared: &[(&str, &[&str], &'static str)] = &[
        ("pubsub", &["help"], "lists every app's channels"),
        ("function", &["help"], "reads, runs or stops every app's functions"),
        ("script", &["exists", "load", "help"], "stops or reads another app's scripts"),
        ("memory", &["usage", "help"], "reads or works the whole server's memory"),
        (
            "cluster",
            &["info", "keyslot", "links", "myid", "myshardid", "nodes", "shards", "slots", "help"],
            "reaches any app's keys of a slot",
        ),
    ];
    let container = shared
        .iter()
        .find(|(c, keeps, _)| e.words.len() == 2 && e.words[0] == *c && !keeps.contains(&e.words[1].as_str()));
    if e.keyless && e.is_admin() {
        Some("administers the server")
    } else if e.keyless && ((cat("@keyspace") && data) || cat("@dangerous")) {
        Some("reaches every key or the server")
    } else if e.keyless && cat("@scripting") && e.flags.iter().any(|f| f == "write") {
        Some("replaces every app's functions")
    } else if databases.contains(&name) || name == "select" || name == "swapdb" {
        Some("names another database")
    } else if name == "migrate" {
        Some("names another server")
    } else if name == "restore" || name == "restore-asking" {
        Some("loads a payload Redis may not check")
    } else if let Some((_, _, why)) = container {
        Some(why)
    } else {
        None
    }
}

/// Whether `error` is a refusal by a rule: the front's (403 NOPERM, a command not available
/// over REST), Redis's ACL, or Redis's own rules for scripts (a command not allowed from a
/// script, a write from a read-only one). Any other error (arguments Redis could not read, a
/// state it would not act on) means the command was let through.
fn refused_by_rule(error: &str) -> bool {
    acl_refused(error)
        || error.starts_with("NOPERM")
        || error.contains("not available over REST")
        || error.contains("shared connection")
        || error.contains("is not allowed from script")
        || error.contains("not allowed from read-only scripts")
        || error.contains("write flag using *_ro command")
}

/// Commands of the `@connection` category that only read the connection or the table; every
/// other one changes the connection it runs on (a newer server's new one included).
fn reads_the_connection(e: &super::front_trust::Entry) -> bool {
    e.words[0] == "command"
        || [
            "ping",
            "echo",
            "client|id",
            "client|info",
            "client|getname",
            "client|getredir",
            "client|trackinginfo",
            "client|help",
            "client|list",
        ]
        .contains(&e.words.join("|").as_str())
}

/// What a tenant could change or see of others: every database's keys and values, the function
/// libraries, the scripts loaded.
fn world(c: &mut redis::Connection, shas: &[String]) -> String {
    let digest: String = redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap();
    let keyspace: String = redis::cmd("INFO").arg("keyspace").query(c).unwrap();
    let functions: Vec<u8> = redis::cmd("FUNCTION").arg("DUMP").query(c).unwrap();
    let scripts: Vec<i64> = redis::cmd("SCRIPT").arg("EXISTS").arg(shas).query(c).unwrap();
    let keyspace: Vec<&str> =
        keyspace.lines().filter(|l| l.starts_with("db")).map(|l| l.split(',').next().unwrap()).collect();
    format!("digest {digest}, {keyspace:?}, {} bytes of functions, scripts {scripts:?}", functions.len())
}

/// The state of the front's pooled Redis connections (every connection logged in as one of
/// `users`): the database, name, flags, transaction, subscriptions, redirection and library a
/// request could have changed, each as the front made it.
fn pooled_connections(c: &mut redis::Connection, users: &[&str]) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines()
        .filter(|l| users.iter().any(|u| l.contains(&format!(" user={u} "))))
        .filter_map(|l| {
            let field = |k: &str| l.split(' ').find_map(|f| f.strip_prefix(&format!("{k}="))).unwrap_or("").to_string();
            let changed = field("db") != "0"
                || !field("name").is_empty()
                || field("flags") != "N"
                || field("multi") != "-1"
                || ["sub", "psub", "ssub"].iter().any(|k| !matches!(field(k).as_str(), "0" | ""))
                || field("redir") != "-1"
                || !matches!(field("lib-name").as_str(), "" | "redis-rs");
            changed.then(|| l.to_string())
        })
        .collect()
}

/// The attack, generated: every command the `COMMAND` table shows reaching beyond one
/// app (all keys, the server, another database, every app's scripts) or changing the
/// connection, sent by every kind of token as a command and inside EVAL, EVAL_RO, EVALSHA,
/// EVALSHA_RO, FCALL and FCALL_RO, with docs/front.md's example users exactly as written. A
/// `--tokens` token is refused each, and nothing of any database changes; the read-only token
/// changes nothing; no token's request changes the front's pooled connections; a connection
/// change is refused as a command to every token. Then the operator's later edits: a rule that
/// allows KEYS again, a selector, and a user the front may not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_no_other_app_from_inside_a_script() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    for (user, pw) in [("app1", "pw-app1-0123456789"), ("app2", "pw-app2-0123456789")] {
        let rules = readme_user_rules(user);
        let mut all = vec![user.to_string(), "on".into(), format!(">{pw}")];
        all.extend(rules);
        acl(&redis, &all.iter().map(String::as_str).collect::<Vec<_>>());
    }
    {
        let mut c = redis.conn();
        for (db, k, v) in [
            (0, "app1:x", "1"),
            (0, "app2:secret", "s2"),
            (1, "app1:x", "db1-secret"),
            (1, "app2:y", "db1-secret2"),
            (2, "zz-db2", "zz-v"),
        ] {
            let _: () = redis::pipe().cmd("SELECT").arg(db).cmd("SET").arg(k).arg(v).ignore().query(&mut c).unwrap();
        }
    }
    let (t1, t1r, t2) = (secret("t1"), secret("t1r"), secret("t2"));
    let dir = scratch_dir("tokens-wide");
    let file = dir.join("tokens.json");
    write_tokens(
        &file,
        &[
            (&t1, "app1", "pw-app1-0123456789", false),
            (&t1r, "app1", "pw-app1-0123456789", true),
            (&t2, "app2", "pw-app2-0123456789", false),
        ],
    );
    let front = Front::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();
    // The full token loads what the others run: a script that runs its arguments, and functions
    // that do (one flagged no-writes, for FCALL_RO).
    let generic = "return redis.call(unpack(ARGV))";
    let (s, v) = post(&url, &front.token, json!(["SCRIPT", "LOAD", generic])).await;
    assert_eq!(s, 200, "{v}");
    let sha = v["result"].as_str().unwrap().to_string();
    let lib = "#!lua name=tenantlib\n\
        redis.register_function('rc_w', function(keys, args) return redis.call(unpack(args)) end)\n\
        redis.register_function{function_name='rc_r', callback=function(keys, args) return redis.call(unpack(args)) end, flags={'no-writes'}}";
    let (s, v) = post(&url, &front.token, json!(["FUNCTION", "LOAD", lib])).await;
    assert_eq!(s, 200, "{v}");
    let shas = vec![sha.clone()];

    let table = super::front_trust::entries(&redis);
    let databases = naming_a_database(&redis);
    let mut cases: Vec<(String, &'static str, Vec<String>)> = Vec::new();
    for e in &table {
        let why = match beyond_one_app(e, &databases) {
            Some(why) => why,
            None if e.categories.iter().any(|c| c == "@connection") && !reads_the_connection(e) => {
                "changes the connection"
            }
            None => continue,
        };
        // Each at its least arity (what a longer form adds is arguments, not reach).
        let mut lists: Vec<Vec<String>> =
            super::front_trust::argument_lists(e, "app1:x", "*").into_iter().take(1).collect();
        if !e.is_admin() {
            // Database numbers that differ (SWAPDB 0 1, MOVE app1:x 1, COPY … DB 1).
            for mut l in super::front_trust::argument_lists(e, "app1:x", "?").into_iter().take(1) {
                for (n, a) in l.iter_mut().filter(|a| *a == "?").enumerate() {
                    *a = (n % 2).to_string();
                }
                lists.push(l);
            }
        }
        for l in lists {
            cases.push((e.words.join("|"), why, l));
        }
    }
    // The issue's own attacks, several steps in one script.
    let attacks = [
        "redis.call('select', 1) return redis.call('get', 'app1:x')",
        "redis.call('select', 1) return redis.call('move', 'app1:x', 0)",
        "redis.call('select', 1) return redis.call('flushdb')",
        "return redis.call('scan', '0', 'count', '1000')",
        "return redis.call('swapdb', 0, 1)",
        "return redis.call('copy', 'app1:x', 'app1:x', 'db', 2)",
    ];
    let names: Vec<&str> = cases.iter().map(|(n, _, _)| n.as_str()).collect();
    for must in [
        "keys",
        "scan",
        "randomkey",
        "dbsize",
        "flushall",
        "flushdb",
        "swapdb",
        "select",
        "move",
        "copy",
        "migrate",
        "restore",
        "restore-asking",
        "pubsub|channels",
        "pubsub|numsub",
        "function|list",
        "script|kill",
        "memory|doctor",
    ] {
        assert!(names.contains(&must), "{must} is among the generated cases: {names:?}");
    }
    println!("{} cases from the COMMAND table", cases.len());

    // The test's own connection (default user, database 0) for every check.
    let mut checks = redis.conn();
    let mut before = world(&mut checks, &shas);
    let front_users: Vec<String> = {
        let list: Vec<String> = redis::cmd("ACL").arg("USERS").query(&mut redis.conn()).unwrap();
        list.into_iter().filter(|u| u.starts_with("redcount-rest-") || u.starts_with("app")).collect()
    };
    let front_users: Vec<&str> = front_users.iter().map(String::as_str).collect();
    let mut failures: Vec<String> = Vec::new();
    // The full token last: it may flush and swap what the others' checks compare.
    for (kind, token) in
        [("--tokens", &t1), ("--tokens read-only", &t1r), ("read-only", &front.readonly_token), ("full", &front.token)]
    {
        let tenant = kind.starts_with("--tokens");
        for (name, why, words) in &cases {
            // The front's own tokens' administration is front_trust's (by every way in).
            if !tenant && *why == "administers the server" {
                continue;
            }
            let keys: Vec<String> =
                if words.iter().any(|w| w == "app1:x") { vec!["1".into(), "app1:x".into()] } else { vec!["0".into()] };
            let mut ways: Vec<(String, Vec<String>)> = vec![("command".into(), words.clone())];
            for (way, head) in [
                ("EVAL", vec!["EVAL".to_string(), generic.to_string()]),
                ("EVAL_RO", vec!["EVAL_RO".to_string(), generic.to_string()]),
                ("EVALSHA", vec!["EVALSHA".to_string(), sha.clone()]),
                ("EVALSHA_RO", vec!["EVALSHA_RO".to_string(), sha.clone()]),
                ("FCALL", vec!["FCALL".to_string(), "rc_w".to_string()]),
                ("FCALL_RO", vec!["FCALL_RO".to_string(), "rc_r".to_string()]),
            ] {
                ways.push((way.into(), [head, keys.clone(), words.clone()].concat()));
            }
            // The ways of one case at once (the front serves them on separate connections).
            let mut sent = tokio::task::JoinSet::new();
            for (i, (_, body)) in ways.iter().enumerate() {
                let (url, token, body) = (url.clone(), token.to_string(), json!(body));
                sent.spawn(async move { (i, post(&url, &token, body).await) });
            }
            let mut answers = sent.join_all().await;
            answers.sort_by_key(|(i, _)| *i);
            for ((way, body), (_, (status, v))) in ways.into_iter().zip(answers) {
                let error = v["error"].as_str().unwrap_or_default().to_string();
                let shown: String = v.to_string().chars().take(300).collect();
                let case = format!("{kind} token, {name} ({why}) {way}: {body:?} -> {status} {shown}");
                if way == "command" && *why == "changes the connection" {
                    let front_said = error.contains("not available over REST")
                        || error.contains("shared connection")
                        || error.contains("--allow-admin-commands");
                    if !front_said {
                        failures.push(format!("not refused by the front: {case}"));
                    }
                }
                // Inside a script a connection command changes the script's own client, not the
                // front's connections (checked below for every token): Valkey runs READONLY,
                // READWRITE, WAIT there, Redis 7.0 refuses them.
                let scripted_connection = way != "command" && *why == "changes the connection";
                if tenant {
                    if status == 200 && !scripted_connection {
                        failures.push(format!("ran: {case}"));
                    } else if !scripted_connection && !refused_by_rule(&error) {
                        failures.push(format!("let through (not refused by a rule): {case}"));
                    }
                    if ["app2", "secret", "zz-"].iter().any(|s| mentions(&v, s)) {
                        failures.push(format!("another app's data in the answer: {case}"));
                    }
                }
            }
            // Checked once a case (all its ways), to keep the test short.
            let case = format!("{kind} token, {name} ({why}) {words:?}");
            if kind != "full" {
                let now = world(&mut checks, &shas);
                if now != before {
                    failures.push(format!("changed {before} to {now}: {case}"));
                    before = now;
                }
            }
            let changed = pooled_connections(&mut checks, &front_users);
            if !changed.is_empty() {
                failures.push(format!("a pooled connection changed ({changed:?}): {case}"));
            }
        }
        if tenant {
            for src in attacks {
                for way in ["EVAL", "EVAL_RO"] {
                    let (status, v) = post(&url, token, json!([way, src, "0"])).await;
                    let case = format!("{kind} token, {way} {src:?} -> {status} {v}");
                    if status == 200 || mentions(&v, "secret") {
                        failures.push(format!("ran: {case}"));
                    }
                }
            }
            let now = world(&mut checks, &shas);
            if now != before {
                failures.push(format!("{kind} token's scripts changed {before} to {now}"));
                before = now;
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Whether `error` is the server's ACL refusal of a command inside a script (Redis 7.0: "can't
/// run this command", Valkey: "no permissions to run").
fn acl_refused(error: &str) -> bool {
    error.contains("can't run this command") || error.contains("no permissions to run")
}

/// Polls `check` every 100 ms for up to `secs` seconds; true once it holds.
async fn within<F: std::future::Future<Output = bool>>(secs: u64, mut check: impl FnMut() -> F) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Whether Redis lets `user` run `words` (ACL DRYRUN).
fn may(redis: &RedisServer, user: &str, words: &[&str]) -> bool {
    let answer: redis::Value = redis::cmd("ACL").arg("DRYRUN").arg(user).arg(words).query(&mut redis.conn()).unwrap();
    matches!(answer, redis::Value::Okay) || matches!(&answer, redis::Value::SimpleString(s) if s == "OK")
}

/// What the operator does to a tenant's user after the front started: a rule that allows the
/// keyspace walks again, a selector that does, a Redis restarted with the user from its own
/// configuration. The front puts its rules back (within a round of its check, or before the
/// first command of a new connection); where it cannot (its own user lost the right), the
/// tenant's token is refused until it can; and at start a front that cannot put them on
/// refuses to start, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_keeps_its_rules_on_tenant_users() {
    // The users as a configuration makes them (redis-server takes a line's words as arguments).
    let mut args: Vec<String> = "--user keeper on >pw-keeper-0123456789 ~* &* +@all --user app1 on >pw-app1-0123456789"
        .split(' ')
        .map(String::from)
        .collect();
    args.extend(readme_user_rules("app1"));
    let mut redis = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let t1 = secret("t1");
    let file = scratch_dir("tokens-keep").join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false)]);
    let url = format!("redis://keeper:pw-keeper-0123456789@127.0.0.1:{}/", redis.port());
    let front = Front::start_with(&url, false, &["--tokens", file.to_str().unwrap()]);
    let base = front.url();
    let walk = json!(["EVAL", "return redis.call('keys', '*')", "0"]);
    let refused = || {
        let (base, t1, walk) = (base.clone(), t1.clone(), walk.clone());
        async move {
            let (s, v) = post(&base, &t1, walk).await;
            s == 400 && v["error"].as_str().is_some_and(acl_refused)
        }
    };
    assert!(refused().await, "a keyspace walk inside a script\n{}", front.log());
    // The token logs in as a user of the front's, derived from the operator's, which keeps its rules.
    let users = token_users(&redis, "app1");
    assert_eq!(users.len(), 1, "{users:?}");
    let user = users[0].as_str();
    assert!(!may(&redis, user, &["keys", "*"]) && may(&redis, user, &["get", "app1:x"]));
    assert!(!may(&redis, user, &["get", "app2:x"]), "the operator's key patterns");
    assert_eq!(post(&base, &t1, json!(["SET", "app1:x", "1"])).await, (200, json!({"result": "OK"})));

    // The operator allows every command again, then adds a selector that allows the walks.
    for edit in [&["app1", "+@all"][..], &["app1", "(~* +keys +scan +flushall)"]] {
        acl(&redis, edit);
        assert!(within(8, refused).await, "after ACL SETUSER {edit:?}\n{}", front.log());
        for words in [&["keys", "*"][..], &["scan", "0"], &["flushall"]] {
            assert!(!may(&redis, user, words), "{words:?} after {edit:?}");
        }
    }
    // (Derived again from the edited user within a round, which the log says.)
    assert!(within(8, || async { front.log().contains("had been changed") }).await, "{}", front.log());

    // A restarted Redis makes the user again from its configuration, without the front's
    // rules: they are back before the first command of a new connection.
    redis.restart();
    let (s, v) = post(&base, &t1, walk.clone()).await;
    assert!(s != 200, "right after a restart: {s} {v}");
    assert!(within(8, refused).await, "after a restart\n{}", front.log());

    // The front's own user loses the right to change users: a change to the tenant's user (a
    // new key pattern) cannot reach the token's, so its token is refused, until the right is back.
    acl(&redis, &["keeper", "-acl|setuser"]);
    acl(&redis, &["app1", "~other:*"]);
    let suspended = || {
        let (base, t1) = (base.clone(), t1.clone());
        async move { post(&base, &t1, json!(["GET", "app1:x"])).await.0 == 503 }
    };
    assert!(within(8, suspended).await, "a user the front cannot keep\n{}", front.log());
    acl(&redis, &["keeper", "+acl|setuser"]);
    assert!(within(8, refused).await, "kept again\n{}", front.log());
    assert_eq!(post(&base, &t1, json!(["GET", "app1:x"])).await.0, 200);

    // At start: a front whose user may not change users refuses to start, and says why.
    acl(&redis, &["limited", "on", ">pw-limited-0123456789", "~*", "&*", "+@all", "-@admin"]);
    let limited = format!("redis://limited:pw-limited-0123456789@127.0.0.1:{}/", redis.port());
    let started = Front::try_start_with(&limited, false, &["--tokens", file.to_str().unwrap()]);
    // What the binary prints when it exits with a failure.
    let err = started.err().unwrap_or_else(|| panic!("started without its rules on the tenant's user"));
    assert!(err.contains("app1") && err.contains("ACL SETUSER"), "{err}");
    assert!(!err.contains(&t1), "the token is printed: {err}");
}

/// On a Cluster every node keeps its own users: the front's rules go on the tenant's user on
/// every node at start, and back on a node where the operator changed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_are_on_every_cluster_node() {
    let cluster = redcount_tests::RedisCluster::start(3);
    let mut user = vec!["app1".to_string(), "on".into(), ">pw-app1-0123456789".into()];
    user.extend(readme_user_rules("app1"));
    for n in &cluster.nodes {
        acl(n, &user.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let t1 = secret("t1");
    let file = scratch_dir("tokens-cluster").join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false)]);
    let front = Front::start_with(&cluster.urls(), true, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();
    let walks = [&["keys", "*"][..], &["scan", "0"], &["flushall"], &["cluster", "getkeysinslot", "0", "10"]];
    for (i, n) in cluster.nodes.iter().enumerate() {
        let users = token_users(n, "app1");
        assert_eq!(users.len(), 1, "node {i}: {users:?}");
        for words in walks {
            assert!(!may(n, &users[0], words), "node {i}: {words:?}");
        }
        assert!(may(n, &users[0], &["get", "app1:x"]), "node {i}: its own keys");
    }
    // Each node's keyspace walk inside a script: a key of that node's slots routes the script.
    for n in &cluster.nodes {
        let tag = (0..)
            .map(|i| format!("app1:{{t{i}}}"))
            .find(|k| redis::cmd("SET").arg(k).arg("1").query::<()>(&mut n.conn()).is_ok());
        let key = tag.unwrap();
        let (s, v) = post(&url, &t1, json!(["EVAL", "return redis.call('keys', '*')", "1", key])).await;
        assert!(s == 400 && v["error"].as_str().is_some_and(acl_refused), "{s} {v}");
        let (s, v) = post(&url, &t1, json!(["GET", key])).await;
        assert_eq!((s, v["result"].as_str()), (200, Some("1")), "{v}");
    }
    // The operator's edit on one node (a selector allowing the walks) is derived again there,
    // with the rules.
    let n2 = &cluster.nodes[2];
    let user = token_users(n2, "app1").remove(0);
    acl(n2, &["app1", "(~* +keys +get +flushall)"]);
    let derived = || async { may(n2, &user, &["get", "zz:other"]) };
    assert!(within(8, derived).await, "node 2 derived again\n{}", front.log());
    assert!(!may(n2, &user, &["keys", "*"]) && !may(n2, &user, &["flushall"]), "node 2 kept");
}

/// The users of the tokens of the README's example users on `redis`: the README's line, with
/// `pw-<name>-0123456789` as the password.
pub(super) fn readme_users(redis: &RedisServer, names: &[&str]) {
    for name in names {
        let mut all = vec![name.to_string(), "on".into(), format!(">pw-{name}-0123456789")];
        all.extend(readme_user_rules(name));
        acl(redis, &all.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// A Redis with the README's users `app1` and `app2` (each also allowed its own channels,
/// `&appN:*`), and a front with a token for each (`tokens.json` in a scratch directory named
/// `tag`): the Redis, the front, the two tokens and the file.
fn two_apps(tag: &str) -> (RedisServer, RestFront, String, String, std::path::PathBuf) {
    let redis = RedisServer::start();
    readme_users(&redis, &["app1", "app2"]);
    acl(&redis, &["app1", "&app1:*"]);
    acl(&redis, &["app2", "&app2:*"]);
    let (t1, t2) = (secret("t1"), secret("t2"));
    let file = scratch_dir(tag).join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false), (&t2, "app2", "pw-app2-0123456789", false)]);
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    (redis, front, t1, t2, file)
}

/// A DUMP payload whose list claims a 1 GiB entry, with a valid checksum: Redis accepts it
/// unchecked (its default `sanitize-dump-payload no`) and dies on the next read of the key.
const CRAFTED_DUMP: &str = "12010210100000000200f00000004041414141ff0a00fbc93321d2d35745";

/// What a tenant may not do to the server or another app though it names its own key or
/// channel: RESTORE a crafted payload (a script builds it, or the path-style body carries it:
/// no script needed), MIGRATE (another database, any host), list other apps' channels. The
/// full token's RESTORE of the same payload is refused by Redis itself: the front makes it
/// check every client's payload. Redis stays up throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_can_neither_crash_redis_nor_reach_past_its_keys_and_channels() {
    let (redis, front, t1, t2, _) = two_apps("tokens-crash");
    let url = front.url();
    let http = redcount_tests::http();
    let payload: Vec<u8> =
        (0..CRAFTED_DUMP.len()).step_by(2).map(|i| u8::from_str_radix(&CRAFTED_DUMP[i..i + 2], 16).unwrap()).collect();
    let alive = |redis: &RedisServer| {
        let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut redis.conn());
        pong.is_ok()
    };

    // Inside a script (built from hex), and path-style with the raw body.
    let restore = "local s = ARGV[1]:gsub('..', function(c) return string.char(tonumber(c, 16)) end) \
        return redis.call(ARGV[2], KEYS[1], 0, s, 'REPLACE')";
    for (i, name) in ["RESTORE", "RESTORE-ASKING"].iter().enumerate() {
        let key = format!("app1:evil{i}");
        let (s, v) = post(&url, &t1, json!(["EVAL", restore, "1", key, CRAFTED_DUMP, name])).await;
        assert!(s != 200 && v["error"].as_str().is_some_and(refused_by_rule), "{name} in a script: {s} {v}");
        let r = http
            .post(format!("{url}/{}/app1:evilp{i}/0?REPLACE", name.to_lowercase()))
            .bearer_auth(&t1)
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        let (s, text) = (r.status().as_u16(), r.text().await.unwrap());
        assert_eq!(s, 403, "{name} path-style: {text}");
    }
    for key in ["app1:evil0", "app1:evil1", "app1:evilp0", "app1:evilp1"] {
        let _ = post(&url, &t1, json!(["LRANGE", key, "0", "-1"])).await;
        assert!(alive(&redis), "Redis died reading {key}");
    }
    // The full token may RESTORE, but Redis checks the payload: refused, nothing stored.
    let r = http.post(format!("{url}/restore/x:evil/0?REPLACE")).bearer_auth(&front.token).body(payload).send().await;
    let r = r.unwrap();
    let (s, text) = (r.status().as_u16(), r.text().await.unwrap());
    assert!(s == 400 && text.contains("Bad data format"), "the full token's crafted RESTORE: {s} {text}");
    let exists: i64 = redis::cmd("EXISTS").arg("x:evil").query(&mut redis.conn()).unwrap();
    let _ = post(&url, &front.token, json!(["LRANGE", "x:evil", "0", "-1"])).await;
    assert!(alive(&redis) && exists == 0, "the full token's crafted RESTORE was stored");
    let set: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("sanitize-dump-payload").query(&mut redis.conn()).unwrap();
    assert_eq!(set[1], "clients", "the front makes Redis check client payloads");

    // MIGRATE inside a script: neither into another database nor to another host.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    assert_eq!(post(&url, &t1, json!(["SET", "app1:m", "moved"])).await.0, 200);
    let migrate = "return redis.call('MIGRATE', ARGV[1], ARGV[2], KEYS[1], ARGV[3], 500, 'COPY', 'REPLACE')";
    for (host, port, db) in [("127.0.0.1", port.as_str(), "0"), ("127.0.0.1", &redis.port().to_string(), "3")] {
        let (s, v) = post(&url, &t1, json!(["EVAL", migrate, "1", "app1:m", host, port, db])).await;
        assert!(s != 200 && v["error"].as_str().is_some_and(refused_by_rule), "MIGRATE to {port} db {db}: {s} {v}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(listener.accept().is_err(), "Redis connected to the address MIGRATE named");
    let in_db3: i64 =
        redis::pipe().cmd("SELECT").arg(3).ignore().cmd("DBSIZE").query::<(i64,)>(&mut redis.conn()).unwrap().0;
    assert_eq!(in_db3, 0, "MIGRATE wrote into database 3");

    // Another app's channels: not listed, not counted.
    let _sub = subscribed(&url, &t2, "app2:private-orders").await;
    for words in [
        json!(["PUBSUB", "CHANNELS"]),
        json!(["PUBSUB", "NUMSUB", "app2:private-orders"]),
        json!(["PUBSUB", "NUMPAT"]),
        json!(["PUBSUB", "SHARDCHANNELS"]),
    ] {
        let (s, v) = post(&url, &t1, words.clone()).await;
        assert_eq!(s, 403, "{words}: {v}");
        let mut script = vec![json!("EVAL"), json!("return redis.call(unpack(ARGV))"), json!("0")];
        script.extend(words.as_array().unwrap().iter().cloned());
        let (s, v) = post(&url, &t1, json!(script)).await;
        assert!(s != 200 && !mentions(&v, "private"), "{words} in a script: {s} {v}");
    }
    assert!(alive(&redis));
}

/// The Redis users a token of the operator's user `user` logs in as: the front's own, derived
/// from it (`redcount-rest-t-<user>-…`).
fn token_users(redis: &RedisServer, user: &str) -> Vec<String> {
    let users: Vec<String> = redis::cmd("ACL").arg("USERS").query(&mut redis.conn()).unwrap();
    users.into_iter().filter(|u| u.starts_with(&format!("redcount-rest-t-{user}-"))).collect()
}

/// Connections to `redis` logged in as `user` or as a user the front derived from it.
fn connections_of(redis: &RedisServer, user: &str) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut redis.conn()).unwrap();
    let derived = format!(" user=redcount-rest-t-{user}-");
    list.lines().filter(|l| l.contains(&format!(" user={user} ")) || l.contains(&derived)).count()
}

/// Re-running the README's own line for a tenant's user (to rotate its password, or after
/// adding a key pattern) resets its commands to `+@all`: the token's scripts never run what
/// the front denies, at any moment (the token logs in as a user the front derives, which the
/// operator's edit does not reach); what the operator restricts reaches the token within a
/// round of the front's check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn editing_a_tenants_user_opens_no_window() {
    let redis = RedisServer::start();
    readme_users(&redis, &["app1", "app2"]);
    let _: () = redis::cmd("SET").arg("app2:secret").arg("s").query(&mut redis.conn()).unwrap();
    let t1 = secret("t1");
    let file = scratch_dir("tokens-window").join("tokens.json");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-0123456789", false)]);
    let front = RestFront::start_with(&redis.url(), false, &["--tokens", file.to_str().unwrap()]);
    let url = front.url();
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await.0, 200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let walkers: Vec<_> = (0..4)
        .map(|w| {
            let (url, t1, stop) = (url.clone(), t1.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut walked, mut served, mut sent) = (Vec::new(), 0, 0);
                let http = redcount_tests::http();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let scripts = [
                        "return redis.call('keys', '*')",
                        "return redis.call('dbsize')",
                        "return redis.call('flushall')",
                    ];
                    let body = if w == 0 { json!(["GET", "app1:x"]) } else { json!(["EVAL", scripts[w % 3], "0"]) };
                    let r = http.post(format!("{url}/")).bearer_auth(&t1).body(body.to_string()).send().await.unwrap();
                    let (status, text) = (r.status().as_u16(), r.text().await.unwrap());
                    sent += 1;
                    match (w, status) {
                        (0, 200) => served += 1,
                        (0, _) => {}
                        (_, 200) => walked.push(text),
                        _ => {}
                    }
                }
                (walked, served, sent)
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let mut edits = 0;
    while started.elapsed() < Duration::from_millis(2_500) {
        let mut line = vec!["app1".to_string(), "on".into(), ">pw-app1-0123456789".into()];
        line.extend(readme_user_rules("app1"));
        acl(&redis, &line.iter().map(String::as_str).collect::<Vec<_>>());
        edits += 1;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut walked, mut served, mut sent) = (Vec::new(), 0, 0);
    for w in walkers {
        let (a, b, c) = w.await.unwrap();
        walked.extend(a);
        served += b;
        sent += c;
    }
    println!("{edits} edits, {sent} requests, {served} GETs served");
    assert!(walked.is_empty(), "{} of the token's scripts ran, first: {}", walked.len(), walked[0]);
    assert!(served > 10, "the token was served meanwhile ({served})");
    let secret: Option<String> = redis::cmd("GET").arg("app2:secret").query(&mut redis.conn()).unwrap();
    assert_eq!(secret.as_deref(), Some("s"), "another app's key survives");
    // A restriction of the operator's reaches the token within a round of the check.
    acl(&redis, &["app1", "-get"]);
    let denied = || {
        let (url, t1) = (url.clone(), t1.clone());
        async move { error_code(&post(&url, &t1, json!(["GET", "app1:x"])).await.1) == Some("NOPERM") }
    };
    assert!(within(6, denied).await, "the operator's -get\n{}", front.log());
    acl(&redis, &["app1", "+get"]);
    let allowed = || {
        let (url, t1) = (url.clone(), t1.clone());
        async move { post(&url, &t1, json!(["GET", "app1:x"])).await == (200, json!({"result": "1"})) }
    };
    assert!(within(6, allowed).await, "the operator's +get\n{}", front.log());
}

/// The operator revokes a tenant the Redis way: its user off, its password changed, the user
/// deleted. Each cuts the token off within a round of the front's check (its pooled and
/// subscription connections closed, 503 naming why), and the token is served again once the
/// user is back (a new password: once the file has it, after SIGHUP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_tenants_user_in_redis_cuts_its_token_off() {
    let (redis, front, t1, t2, file) = two_apps("tokens-revoke-redis");
    let url = front.url();
    assert_eq!(post(&url, &t1, json!(["SET", "app1:x", "1"])).await.0, 200);
    let mut sub = subscribed(&url, &t1, "app1:news").await;
    assert!(connections_of(&redis, "app1") >= 2, "a pooled connection and the subscriber's");
    let refused_for = |why: &'static str| {
        let (url, t1) = (url.clone(), t1.clone());
        move || {
            let (url, t1) = (url.clone(), t1.clone());
            async move {
                let (s, v) = post(&url, &t1, json!(["GET", "app1:x"])).await;
                s == 503 && v["error"].as_str().is_some_and(|e| e.contains(why))
            }
        }
    };
    let served = || {
        let (url, t1) = (url.clone(), t1.clone());
        async move { post(&url, &t1, json!(["GET", "app1:x"])).await == (200, json!({"result": "1"})) }
    };

    acl(&redis, &["app1", "off"]);
    assert!(within(6, refused_for("is off")).await, "user off\n{}", front.log());
    assert!(within(3, || async { connections_of(&redis, "app1") == 0 }).await, "connections of app1 remain");
    let ended =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = sub.chunk().await {} }).await;
    assert!(ended.is_ok(), "the subscription of a token whose user is off is still open");
    assert_eq!(post(&url, &t2, json!(["PING"])).await.0, 200, "another app's token is served");
    acl(&redis, &["app1", "on"]);
    assert!(within(6, served).await, "user on again\n{}", front.log());

    acl(&redis, &["app1", "resetpass", ">pw-app1-rotated-0123"]);
    assert!(within(6, refused_for("password")).await, "password changed\n{}", front.log());
    assert!(within(3, || async { connections_of(&redis, "app1") == 0 }).await, "connections of app1 remain");
    write_tokens(&file, &[(&t1, "app1", "pw-app1-rotated-0123", false), (&t2, "app2", "pw-app2-0123456789", false)]);
    assert!(Command::new("kill").args(["-HUP", &front.pid().to_string()]).status().unwrap().success());
    assert!(within(6, served).await, "the file has the new password\n{}", front.log());

    let _: i64 = redis::cmd("ACL").arg("DELUSER").arg("app1").query(&mut redis.conn()).unwrap();
    assert!(within(6, refused_for("does not exist")).await, "user deleted\n{}", front.log());
    assert!(token_users(&redis, "app1").is_empty(), "the token's user outlives the operator's");
    let log = front.log();
    for s in [&t1, &t2, &"pw-app1-rotated-0123".to_string(), &"pw-app1-0123456789".to_string()] {
        assert!(!log.contains(s.as_str()), "a secret in the log:\n{log}");
    }
}
