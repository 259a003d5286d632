//! Which commands a request may run: read-only ones (from Redis's own COMMAND flags),
//! and those refused because they would hold or block the shared connection.

use std::collections::HashMap;

use redis::Value;

use crate::backend::Backend;

/// What the front needs to know of one command, from its COMMAND entry ([`Table::flags`]);
/// an unknown command has none of them.
#[derive(Clone, Copy, Default)]
pub struct Flags {
    /// `readonly`, and neither `write` nor `may_replicate` (PFCOUNT rewrites the cached
    /// cardinality in its value: Redis propagates it as a write).
    pub readonly: bool,
    /// Flag `admin` or ACL category `@admin`: changes or inspects the server rather than the
    /// data (CONFIG SET, SHUTDOWN, DEBUG, ROLE, LASTSAVE...); or moves data off this server
    /// (MIGRATE). For a container without its subcommand, the container's.
    pub admin: bool,
    /// COMMAND's arity: the number of arguments with the name, at least its absolute value
    /// when negative; 0 for an unknown command.
    arity: i64,
    /// Reaches beyond the keys and channels an ACL user's patterns name, so that one app's
    /// token must not run it, even inside a script: it names no key yet reaches every key or
    /// the server (`@keyspace` reads and writes, `@dangerous`, administration: KEYS, SCAN,
    /// RANDOMKEY, DBSIZE, FLUSHALL, FLUSHDB, SWAPDB, INFO, CONFIG…), replaces every app's
    /// functions (`@scripting` writes naming no key: FUNCTION LOAD, FLUSH, DELETE, RESTORE), is
    /// one of [`BEYOND_ONE_APP`], or a subcommand of a container of [`SHARED_STATE`] but those
    /// it keeps.
    pub beyond_one_app: bool,
    /// A read-only token may not run it: it walks or counts the whole keyspace (keyless
    /// `@keyspace` reads: KEYS, SCAN, RANDOMKEY, DBSIZE), or one of [`KEYSPACE_READS`].
    pub walks_keyspace: bool,
    /// Changes the connection it runs on (category `@connection`, but for the few that only
    /// read it, [`READS_THE_CONNECTION`]): on the front's shared connections it would change
    /// them for every later request.
    pub changes_connection: bool,
}

/// What Redis's table cannot tell about reaching beyond one app's keys, though each names a
/// key: SELECT, MOVE and COPY (another database: MOVE always, COPY with `DB`, which an ACL rule
/// cannot tell apart); MIGRATE (another database, or any host Redis can reach, with any
/// credentials); RESTORE and RESTORE-ASKING (a crafted payload, which Redis checks only with
/// `sanitize-dump-payload`, can crash the server for every app). Their entries flag none of
/// that.
const BEYOND_ONE_APP: &[&str] = &["select", "move", "copy", "migrate", "restore", "restore-asking"];

/// Containers whose subcommands read or change what every app shares, with the few of each
/// that an app may still run (its own key, or help): every other subcommand, a newer server's
/// new one included, reaches beyond one app. PUBSUB (every app's channels and their
/// subscribers), FUNCTION (every app's functions: their code, what runs now, killing it),
/// SCRIPT (KILL stops another app's script, FLUSH every app's, SHOW on Valkey reads any app's
/// source), MEMORY (the server's memory, every app's together; PURGE spends its time), CLUSTER
/// (GETKEYSINSLOT, COUNTKEYSINSLOT, SLOT-STATS on Valkey: any app's keys of a slot; the
/// topology stays readable).
const SHARED_STATE: &[(&str, &[&str])] = &[
    ("pubsub", &["help"]),
    ("function", &["help"]),
    ("script", &["exists", "load", "help"]),
    ("memory", &["usage", "help"]),
    ("cluster", &["info", "keyslot", "links", "myid", "myshardid", "nodes", "shards", "slots", "help"]),
];

/// Reads the table does not flag as walking the keyspace, yet naming or counting any key:
/// CLUSTER GETKEYSINSLOT, COUNTKEYSINSLOT and SLOT-STATS (a slot's keys, or their number),
/// MEMORY STATS (every database's key count).
const KEYSPACE_READS: &[&str] =
    &["cluster|getkeysinslot", "cluster|countkeysinslot", "cluster|slot-stats", "memory|stats"];

/// Whether `name` (`container|sub`) is a subcommand of [`SHARED_STATE`] an app may not run.
fn shared_state(name: &str) -> bool {
    let Some((container, sub)) = name.split_once('|') else { return false };
    SHARED_STATE.iter().any(|(c, keeps)| *c == container && !keeps.contains(&sub))
}

/// Commands of category `@connection` that only read the connection (or the command table);
/// every other one, a newer server's new CLIENT subcommand included, changes it.
const READS_THE_CONNECTION: &[&str] = &[
    "ping",
    "echo",
    "client|id",
    "client|info",
    "client|getname",
    "client|getredir",
    "client|trackinginfo",
    "client|help",
    "client|list",
];

/// Command name (lower case, `container|sub` for subcommands) → its flags.
pub struct Table {
    // A fast hash: the table is Redis's, filled once; clients only look names up.
    flags: HashMap<String, Flags, foldhash::fast::RandomState>,
    containers: HashMap<String, (), foldhash::fast::RandomState>,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).to_lowercase()),
        Value::SimpleString(s) => Some(s.to_lowercase()),
        _ => None,
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

impl Table {
    pub async fn load(backend: &Backend) -> Result<Self, String> {
        let reply = backend.query(&redis::cmd("COMMAND")).await.map_err(|e| e.to_string())?;
        let mut t = Table { flags: HashMap::default(), containers: HashMap::default() };
        for entry in items(&reply) {
            t.add(entry);
        }
        if t.flags.is_empty() {
            return Err("empty COMMAND reply".into());
        }
        Ok(t)
    }

    fn add(&mut self, entry: &Value) {
        let e = items(entry);
        let Some(name) = e.first().and_then(text) else { return };
        let flags: Vec<String> = e.get(2).map(items).unwrap_or(&[]).iter().filter_map(text).collect();
        let categories: Vec<String> = e.get(6).map(items).unwrap_or(&[]).iter().filter_map(text).collect();
        let has = |name: &str| flags.iter().any(|f| f == name);
        let category = |c: &str| categories.iter().any(|x| x == c);
        let admin = has("admin") || category("@admin") || name == "migrate";
        // No first key and no key specs (Redis 7): an ACL key pattern has nothing to check.
        let keyless = matches!(e.get(3), Some(Value::Int(0))) && e.get(8).map(items).unwrap_or(&[]).is_empty();
        let data = has("readonly") || has("write");
        let entry_flags = Flags {
            readonly: has("readonly") && !has("write") && !has("may_replicate"),
            admin,
            arity: match e.get(1) {
                Some(Value::Int(n)) => *n,
                _ => 0,
            },
            beyond_one_app: (keyless && ((category("@keyspace") && data) || category("@dangerous") || admin))
                || (keyless && category("@scripting") && has("write"))
                || BEYOND_ONE_APP.contains(&name.as_str())
                || shared_state(&name),
            walks_keyspace: (keyless && category("@keyspace") && has("readonly"))
                || KEYSPACE_READS.contains(&name.as_str()),
            changes_connection: category("@connection")
                && !READS_THE_CONNECTION.contains(&name.as_str())
                && name != "command"
                && !name.starts_with("command|"),
        };
        // Redis 7: element 9 lists subcommands, each a full entry named `container|sub`.
        let subs = e.get(9).map(items).unwrap_or(&[]);
        if !subs.is_empty() {
            self.containers.insert(name.clone(), ());
            for s in subs {
                self.add(s);
            }
        }
        self.flags.insert(name, entry_flags);
    }

    /// The flags of a command (its subcommand's for a container); unknown commands have
    /// none, so they are never read-only.
    pub fn flags(&self, name: &str, args: &[Vec<u8>]) -> Flags {
        // Redis matches names in ASCII case only: a name that is not ASCII is no command of
        // the table, whatever its Unicode lower case.
        if !name.is_ascii() {
            return Flags::default();
        }
        let lower = Cased::lower(name);
        let lower = lower.as_str();
        if self.containers.contains_key(lower)
            && let Some(sub) = args.first()
        {
            let key = format!("{lower}|{}", String::from_utf8_lossy(sub).to_lowercase());
            return self.flags.get(&key).copied().unwrap_or_default();
        }
        self.flags.get(lower).copied().unwrap_or_default()
    }

    /// The name as the log may show it: a command of the table, upper-cased; else `?` (the
    /// client's text, which may be anything, a misplaced token too, never reaches the log).
    pub fn log_name(&self, name: &str) -> String {
        if name.is_ascii() && self.flags.contains_key(name.to_ascii_lowercase().as_str()) {
            name.to_ascii_uppercase()
        } else {
            String::from("?")
        }
    }

    /// True when the command is one Redis knows, with as many arguments as it takes (so
    /// Redis will not refuse it for its name or its argument count).
    pub fn is_well_formed(&self, name: &str, args: &[Vec<u8>]) -> bool {
        let n = i64::try_from(args.len()).unwrap_or(i64::MAX).saturating_add(1);
        match self.flags(name, args).arity {
            0 => false,
            a if a > 0 => n == a,
            a => n >= -a,
        }
    }

    /// The ACL rules that deny a Redis user every command that reaches beyond one app
    /// ([`Flags::beyond_one_app`])
    /// (each command or subcommand by name, `-keys`, `-config|set`…), the front's database
    /// `db` excepted for SELECT (its connections select it when it is not 0).
    pub fn one_app_rules(&self, db: i64) -> Vec<String> {
        let mut rules = self.denying(|f| f.beyond_one_app);
        if db != 0 && self.flags.contains_key("select") {
            rules.push(format!("+select|{db}"));
        }
        rules
    }

    /// The ACL rules that deny a read-only token's Redis user every read of the whole keyspace
    /// ([`Flags::walks_keyspace`]: `-keys`, `-randomkey`, `-cluster|getkeysinslot`…).
    pub fn keyspace_walk_rules(&self) -> Vec<String> {
        self.denying(|f| f.walks_keyspace)
    }

    /// `-name` for every command or subcommand (never a container) whose flags `pick` takes,
    /// in name order.
    fn denying(&self, pick: impl Fn(&Flags) -> bool) -> Vec<String> {
        let mut names: Vec<&String> = self
            .flags
            .iter()
            .filter(|(name, f)| pick(f) && !self.containers.contains_key(*name))
            .map(|(name, _)| name)
            .collect();
        names.sort();
        names.into_iter().map(|n| format!("-{n}")).collect()
    }

    /// One call of each command [`Table::one_app_rules`] denies, its arguments as many `0`s as
    /// its arity asks (SELECT 0 for a front on another database): what `ACL DRYRUN` must
    /// refuse once the rules are on a user.
    pub fn one_app_probes(&self, db: i64) -> Vec<Vec<String>> {
        let mut probes: Vec<Vec<String>> = self
            .flags
            .iter()
            .filter(|(name, f)| f.beyond_one_app && !self.containers.contains_key(*name))
            .map(|(name, f)| {
                let mut words: Vec<String> = name.split('|').map(str::to_string).collect();
                let least = usize::try_from(f.arity.unsigned_abs()).unwrap_or(1).max(1);
                let zero = if name == "select" && db == 0 { "1" } else { "0" };
                while words.len() < least {
                    words.push(zero.to_string());
                }
                words
            })
            .collect();
        probes.sort();
        probes
    }
}

/// A command name in one ASCII case, made without an allocation when it is short (every name
/// the table and the rules know is): as sent when it is in that case already (most clients
/// send capitals), else copied into a buffer; a longer name is copied to the heap.
pub(crate) enum Cased<'a> {
    As(&'a str),
    Copied([u8; 32], usize),
    Long(String),
}

impl<'a> Cased<'a> {
    pub(crate) fn upper(name: &'a str) -> Cased<'a> {
        Cased::to(name, true)
    }

    pub(crate) fn lower(name: &'a str) -> Cased<'a> {
        Cased::to(name, false)
    }

    fn to(name: &'a str, upper: bool) -> Cased<'a> {
        let other = |b: &u8| if upper { b.is_ascii_lowercase() } else { b.is_ascii_uppercase() };
        if !name.as_bytes().iter().any(other) {
            return Cased::As(name);
        }
        let mut buf = [0u8; 32];
        let Some(to) = buf.get_mut(..name.len()) else {
            return Cased::Long(if upper { name.to_ascii_uppercase() } else { name.to_ascii_lowercase() });
        };
        to.copy_from_slice(name.as_bytes());
        if upper {
            to.make_ascii_uppercase();
        } else {
            to.make_ascii_lowercase();
        }
        Cased::Copied(buf, name.len())
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            Cased::As(name) => name,
            // ASCII case changes keep UTF-8 valid.
            Cased::Copied(buf, len) => std::str::from_utf8(&buf[..*len]).unwrap_or_default(),
            Cased::Long(name) => name,
        }
    }
}

pub fn readonly_refusal(name: &str) -> Option<String> {
    let upper = Cased::upper(name);
    let upper = upper.as_str();
    match upper {
        "KEYS" | "SCAN" | "RANDOMKEY" | "DBSIZE" => Some(format!(
            "NOPERM this token is read-only and may not run {upper}: it walks or counts the whole keyspace"
        )),
        // Flagged read-only, yet it stores the cardinality it computed in the value (and
        // Redis replicates that as a write).
        "PFCOUNT" => Some(
            "NOPERM this token is read-only and may not run PFCOUNT: it writes the cached cardinality into the value"
                .into(),
        ),
        _ => None,
    }
}

/// Why a command whose reply is certain to exceed `max_response` bytes is refused before it
/// is sent: SRANDMEMBER, ZRANDMEMBER and HRANDFIELD with a negative count reply `|count|`
/// elements (repeats allowed) of at least 4 bytes each, however small the key; Redis would
/// spend seconds and gigabytes building a reply the front then refuses.
pub fn oversized(name: &str, args: &[Vec<u8>], max_response: usize) -> Option<String> {
    let upper = Cased::upper(name);
    let upper = upper.as_str();
    if !matches!(upper, "SRANDMEMBER" | "ZRANDMEMBER" | "HRANDFIELD") {
        return None;
    }
    let count: i64 = std::str::from_utf8(args.get(1)?).ok()?.parse().ok()?;
    let least = count.unsigned_abs().saturating_mul(4);
    (count < 0 && least > max_response as u64).then(|| {
        format!(
            "ERR {upper} with count {count} replies at least {least} bytes, over the front's --max-response-bytes ({max_response}): ask for fewer"
        )
    })
}

/// Why a set-algebra command that names one key more than once is refused: Redis does the
/// whole work again for every copy, so `SUNION` of one 10,000-member set named 30,000 times
/// (a 210 KB request) holds Redis for 25 s, and no one can stop a single command.
pub fn repeated_keys(name: &str, args: &[Vec<u8>]) -> Option<String> {
    let upper = Cased::upper(name);
    let upper = upper.as_str();
    let numkeys = |at: usize| -> Option<&[Vec<u8>]> {
        let n: usize = std::str::from_utf8(args.get(at)?).ok()?.parse().ok()?;
        args.get(at + 1..(at + 1).checked_add(n)?.min(args.len()))
    };
    let keys: &[Vec<u8>] = match upper {
        "SUNION" | "SINTER" | "SDIFF" => args,
        "SUNIONSTORE" | "SINTERSTORE" | "SDIFFSTORE" => args.get(1..)?,
        "SINTERCARD" | "ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" => numkeys(0)?,
        "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" => numkeys(1)?,
        _ => return None,
    };
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter().find(|k| !seen.insert(k.as_slice())).map(|k| {
        format!(
            "ERR {upper} names key {} more than once: Redis would do the whole work again for each copy",
            String::from_utf8_lossy(&k[..k.len().min(64)])
        )
    })
}

/// Why a command cannot run over REST, if it cannot.
pub fn refusal(name: &str, args: &[Vec<u8>]) -> Option<String> {
    let upper = Cased::upper(name);
    let upper = upper.as_str();
    let arg = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).to_ascii_uppercase());
    match upper {
        "SUBSCRIBE" | "PSUBSCRIBE" => Some(format!(
            "ERR {upper} holds a connection open and is not available as a command: POST /{}/<channel> with Accept: text/event-stream",
            upper.to_ascii_lowercase()
        )),
        "SSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" | "SUNSUBSCRIBE" | "MONITOR" | "SYNC" | "PSYNC" | "REPLCONF" => {
            Some(format!("ERR {upper} holds a connection open and is not available over REST"))
        }
        "WATCH" | "UNWATCH" | "MULTI" | "EXEC" | "DISCARD" => Some(format!(
            "ERR {upper} is not available over REST: send the commands to /multi-exec to run them as one transaction"
        )),
        "SELECT" | "AUTH" | "HELLO" | "QUIT" | "RESET" | "SWAPDB" | "ASKING" | "READONLY" | "READWRITE" => {
            Some(format!("ERR {upper} would change the shared connection and is not available over REST"))
        }
        // O(N×M) time and a (N+1)×(M+1) table in Redis for strings of N and M bytes: two
        // 100 KB values would take seconds and 40 GB, and Redis cannot be stopped inside it.
        "LCS" => Some(
            "ERR LCS is not available over REST: Redis's time and memory for it grow with the product of the two strings' lengths, which the front cannot bound"
                .into(),
        ),
        "SCRIPT" if arg(0).as_deref() == Some("DEBUG") => Some(
            "ERR SCRIPT DEBUG is not available over REST: the debugger holds the connection (and in SYNC mode all of Redis)"
                .into(),
        ),
        "BLPOP" | "BRPOP" | "BRPOPLPUSH" | "BLMOVE" | "BLMPOP" | "BZPOPMIN" | "BZPOPMAX" | "BZMPOP" | "WAIT"
        | "WAITAOF" => Some(format!(
            "ERR blocking command {upper} is not available over REST: it would stall every other request; use its non-blocking form and poll"
        )),
        "XREAD" | "XREADGROUP" if args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK")) => {
            Some(format!("ERR {upper} with BLOCK is not available over REST: drop BLOCK and poll"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::Table;

    fn entry(name: &str, arity: i64, subs: Vec<Value>) -> Value {
        described(name, arity, &[], &[], true, subs)
    }

    /// A COMMAND entry as Redis 7 gives it: flags, first key (1 when `keyed`, with a key spec),
    /// ACL categories.
    fn described(name: &str, arity: i64, flags: &[&str], categories: &[&str], keyed: bool, subs: Vec<Value>) -> Value {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let texts = |l: &[&str]| Value::Array(l.iter().map(|s| text(s)).collect());
        let first = Value::Int(i64::from(keyed));
        let specs = if keyed { vec![Value::Array(vec![text("flags")])] } else { vec![] };
        Value::Array(vec![
            text(name),
            Value::Int(arity),
            texts(flags),
            first.clone(),
            first.clone(),
            first,
            texts(categories),
            Value::Array(vec![]),
            Value::Array(specs),
            Value::Array(subs),
        ])
    }

    /// A table of a few commands as Redis describes them: some that change the connection,
    /// some that reach beyond one app's keys, and some of neither kind.
    fn sample_table() -> Table {
        let mut t = Table { flags: Default::default(), containers: Default::default() };
        add_connection_and_server_commands(&mut t);
        add_keyed_and_container_commands(&mut t);
        t
    }

    fn add_connection_and_server_commands(t: &mut Table) {
        let client = |sub: &str| {
            described(&format!("client|{sub}"), -3, &["noscript"], &["@slow", "@connection"], false, vec![])
        };
        // A newer server's CLIENT subcommands (SETINFO, CAPA) are in `@connection`, as are
        // the ones Redis 7.0 knows: they change the connection unless they only read it.
        t.add(&described(
            "client",
            -2,
            &[],
            &["@slow"],
            false,
            vec![
                client("setname"),
                client("setinfo"),
                client("capa"),
                client("no-touch"),
                client("id"),
                client("info"),
            ],
        ));
        t.add(&described("ping", -1, &["fast"], &["@fast", "@connection"], false, vec![]));
        t.add(&described("select", 2, &["fast"], &["@fast", "@connection"], false, vec![]));
        t.add(&described("keys", 2, &["readonly"], &["@keyspace", "@read", "@slow", "@dangerous"], false, vec![]));
        t.add(&described("dbsize", 1, &["readonly", "fast"], &["@keyspace", "@read", "@fast"], false, vec![]));
        t.add(&described("get", 2, &["readonly", "fast"], &["@read", "@string", "@fast"], true, vec![]));
        t.add(&described("move", 3, &["write", "fast"], &["@keyspace", "@write", "@fast"], true, vec![]));
        t.add(&described("lolwut", -1, &["readonly", "fast"], &["@read", "@fast"], false, vec![]));
        t.add(&described("info", -1, &[], &["@slow", "@dangerous"], false, vec![]));
        t.add(&described(
            "function",
            -2,
            &[],
            &["@slow"],
            false,
            vec![
                described(
                    "function|load",
                    -3,
                    &["write", "noscript"],
                    &["@write", "@slow", "@scripting"],
                    false,
                    vec![],
                ),
                described("function|list", -2, &["noscript"], &["@slow", "@scripting"], false, vec![]),
            ],
        ));
    }

    fn add_keyed_and_container_commands(t: &mut Table) {
        // Keyed, yet reaching the server or another database; containers whose subcommands
        // reach every app's state but the few kept.
        t.add(&described(
            "restore",
            -4,
            &["write", "denyoom"],
            &["@keyspace", "@write", "@slow", "@dangerous"],
            true,
            vec![],
        ));
        t.add(&described("migrate", -6, &["write"], &["@keyspace", "@write", "@slow", "@dangerous"], true, vec![]));
        let sub =
            |name: &str, flags: &[&str], cats: &[&str], keyed: bool| described(name, -2, flags, cats, keyed, vec![]);
        let container = |name: &str, subs| described(name, -2, &[], &["@slow"], false, subs);
        t.add(&container(
            "pubsub",
            vec![
                sub("pubsub|channels", &["pubsub"], &["@pubsub", "@slow"], false),
                sub("pubsub|help", &[], &["@slow"], false),
            ],
        ));
        t.add(&container(
            "memory",
            vec![
                sub("memory|usage", &["readonly"], &["@read", "@slow"], true),
                sub("memory|doctor", &[], &["@slow"], false),
                sub("memory|stats", &[], &["@slow"], false),
            ],
        ));
        t.add(&container(
            "script",
            vec![
                sub("script|exists", &["noscript"], &["@slow", "@scripting"], false),
                sub("script|kill", &["noscript"], &["@slow", "@scripting"], false),
                sub("script|show", &["noscript"], &["@slow", "@scripting"], false),
            ],
        ));
        t.add(&described("randomkey", 1, &["readonly"], &["@keyspace", "@read", "@slow"], false, vec![]));
    }

    #[test]
    fn connection_changes_and_reaching_beyond_one_app_follow_the_table() {
        let t = sample_table();
        let args = |a: &[&str]| a.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        for sub in ["SETNAME", "setinfo", "CAPA", "no-touch"] {
            assert!(t.flags("CLIENT", &args(&[sub, "x"])).changes_connection, "CLIENT {sub}");
        }
        for (name, a) in [("client", &["ID"][..]), ("CLIENT", &["info"]), ("ping", &[]), ("get", &["k"])] {
            assert!(!t.flags(name, &args(a)).changes_connection, "{name} {a:?}");
        }
        assert!(t.flags("select", &args(&["1"])).changes_connection);
        let beyond = [
            "keys",
            "dbsize",
            "move",
            "info",
            "select",
            "function|load",
            "function|list",
            "restore",
            "migrate",
            "pubsub|channels",
            "memory|doctor",
            "memory|stats",
            "script|kill",
            "script|show",
        ];
        for name in beyond {
            let mut words = name.split('|');
            let (cmd, sub) = (words.next().unwrap(), words.next());
            assert!(t.flags(cmd, &args(&sub.into_iter().collect::<Vec<_>>())).beyond_one_app, "{name}");
        }
        for (name, a) in [
            ("get", &["k"][..]),
            ("lolwut", &[]),
            ("ping", &[]),
            ("pubsub", &["help"]),
            ("memory", &["usage", "k"]),
            ("script", &["exists", "x"]),
        ] {
            assert!(!t.flags(name, &args(a)).beyond_one_app, "{name} {a:?}");
        }
        // The ACL rules name each one (never a container), the front's own database excepted.
        let mut rules = t.one_app_rules(0);
        rules.sort();
        assert_eq!(
            rules,
            [
                "-dbsize",
                "-function|list",
                "-function|load",
                "-info",
                "-keys",
                "-memory|doctor",
                "-memory|stats",
                "-migrate",
                "-move",
                "-pubsub|channels",
                "-randomkey",
                "-restore",
                "-script|kill",
                "-script|show",
                "-select"
            ]
        );
        // A read-only token's user: every walk or count of the keyspace.
        assert_eq!(t.keyspace_walk_rules(), ["-dbsize", "-keys", "-memory|stats", "-randomkey"]);
        assert_eq!(t.one_app_rules(3).last().map(String::as_str), Some("+select|3"));
        let probes = t.one_app_probes(0);
        assert!(probes.contains(&vec!["function".to_string(), "load".into(), "0".into()]), "{probes:?}");
        assert!(probes.contains(&vec!["select".to_string(), "1".into()]), "{probes:?}");
        assert!(t.one_app_probes(3).contains(&vec!["select".to_string(), "0".into()]));
    }

    #[test]
    fn well_formed_follows_commands_arity() {
        let mut t = Table { flags: Default::default(), containers: Default::default() };
        t.add(&entry("get", 2, vec![]));
        t.add(&entry("rpush", -3, vec![]));
        t.add(&entry("config", -2, vec![entry("config|get", -3, vec![])]));
        let args = |a: &[&str]| a.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert!(t.is_well_formed("GET", &args(&["k"])));
        assert!(!t.is_well_formed("get", &args(&["k", "extra"])), "fixed arity");
        assert!(t.is_well_formed("RPUSH", &args(&["k", "a", "b"])));
        assert!(!t.is_well_formed("rpush", &args(&["k"])), "at least three with the name");
        assert!(t.is_well_formed("config", &args(&["GET", "maxmemory"])));
        assert!(!t.is_well_formed("config", &args(&["get"])), "the subcommand's own arity");
        assert!(!t.is_well_formed("nosuchcommand", &args(&[])), "unknown to Redis");
    }
}
