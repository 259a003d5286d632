//! `redcount drain`: red-packet grab records from Redis into SQLite, exactly once.
//!
//! Each packet's grab log (`<namespace>:{rp:ID}:log`, namespace `rc` by default) is
//! append-only, so a record's position in it never changes. Drain keeps, per packet, the
//! position of the next record to copy, and advances it in the same SQLite transaction that
//! inserts the records (table `claims`, its first name; primary key:
//! packet + user). A crash at any point leaves either both written or neither: run again,
//! and it continues where the last commit stopped. Redis is only read. On a Redis Cluster
//! (`--cluster`) every master is scanned for logs, and each log is read from its master.

use std::path::Path;

use redcount_core::keys::Namespace;
use redcount_core::ops::Namespaced;
use redcount_core::ops::redpacket::{GrabRecord, ReadGrabs, ReadStatus};
use rusqlite::{Connection, params};

use redcount::Direct;

/// Why a drain stopped: Redis (or bad input), or the SQLite side.
#[derive(Debug)]
pub enum Error {
    /// Reading Redis failed, or an argument was refused.
    Redis(redcount::Error),
    /// The database could not be read or written (nothing of the failed batch was kept).
    Store(rusqlite::Error),
    /// The database holds another namespace's grabs (packet ids are unique only within one).
    OtherNamespace {
        /// The namespace the database was made for.
        stored: String,
        /// The namespace asked for.
        asked: String,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Redis(e) => e.fmt(f),
            Error::Store(e) => write!(f, "sqlite: {e}"),
            Error::OtherNamespace { stored, asked } => write!(
                f,
                "this database holds the grabs of namespace {stored:?}, not {asked:?}: give each namespace a database of its own"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<redcount::Error> for Error {
    fn from(e: redcount::Error) -> Self {
        Error::Redis(e)
    }
}

impl From<redcount_core::InputError> for Error {
    fn from(e: redcount_core::InputError) -> Self {
        Error::Redis(e.into())
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Store(e)
    }
}

/// ReadGrabs read from Redis per transaction.
pub const DEFAULT_BATCH: i64 = 500;

/// The SQLite side.
pub struct Store {
    db: Connection,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

impl Store {
    /// Opens (or creates) the database of namespace `ns`: it records the namespace on first
    /// use and refuses another one afterwards.
    pub fn open(path: &Path, ns: &Namespace) -> Result<Self, Error> {
        let db = Connection::open(path)?;
        // WAL + FULL: a committed transaction survives a crash of this process or the machine.
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS claims (
                 packet TEXT NOT NULL, user TEXT NOT NULL,
                 amount INTEGER NOT NULL, idx INTEGER NOT NULL, at_ms INTEGER NOT NULL,
                 PRIMARY KEY (packet, user));
             CREATE TABLE IF NOT EXISTS cursors (packet TEXT PRIMARY KEY, next INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )?;
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('namespace', ?1)", params![ns.as_str()])?;
        let stored: String = db.query_row("SELECT value FROM meta WHERE key = 'namespace'", [], |r| r.get(0))?;
        if stored != ns.as_str() {
            return Err(Error::OtherNamespace { stored, asked: ns.as_str().to_string() });
        }
        // Stores made before packets' creation times were kept: the column added, empty.
        let born: i64 =
            db.query_row("SELECT COUNT(*) FROM pragma_table_info('cursors') WHERE name = 'born'", [], |r| r.get(0))?;
        if born == 0 {
            db.execute_batch("ALTER TABLE cursors ADD COLUMN born INTEGER")?;
        }
        Ok(Store { db })
    }

    /// The name `packet`'s grabs are stored under, for the packet Redis holds now, created at
    /// `created` (ms; `None`: Redis no longer knows it, its log may remain): the id itself for
    /// the first packet of that id, `<id>@<created>` for one made again later (the same
    /// `Idempotency-Key` after its record expired, so the same id), whose log starts afresh.
    pub fn generation(&mut self, packet: &str, created: Option<i64>) -> Result<String, Error> {
        let rows = self.names(packet)?;
        let Some(created) = created else {
            return Ok(rows.last().map_or_else(|| packet.to_string(), |(name, _)| name.clone()));
        };
        if let Some((name, _)) = rows.iter().find(|(_, born)| *born == Some(created)) {
            return Ok(name.clone());
        }
        // The first packet of that id, or a row from before creation times were kept (taken
        // to be the packet Redis holds now).
        let name = match rows.iter().any(|(name, born)| name == packet && born.is_some()) {
            false => packet.to_string(),
            true => format!("{packet}@{created}"),
        };
        self.db.execute(
            "INSERT INTO cursors (packet, next, born) VALUES (?1, 0, ?2) ON CONFLICT(packet) DO UPDATE SET born = excluded.born",
            params![name, created],
        )?;
        Ok(name)
    }

    /// Every packet stored under id `packet`, oldest first: its name ([`Store::generation`]),
    /// grabs stored and their sum.
    pub fn generations(&self, packet: &str) -> Result<Vec<(String, i64, i64)>, Error> {
        self.names(packet)?
            .into_iter()
            .map(|(name, _)| {
                let (count, sum) = self.totals(&name)?;
                Ok((name, count, sum))
            })
            .collect()
    }

    /// The names stored under id `packet`, oldest first, each with its packet's creation time
    /// (ms; `None` for a store from before creation times were kept).
    pub fn names(&self, packet: &str) -> Result<Vec<(String, Option<i64>)>, Error> {
        let mut st = self.db.prepare_cached(
            "SELECT packet, born FROM cursors WHERE packet = ?1 OR substr(packet, 1, length(?1) + 1) = ?1 || '@'
             ORDER BY born",
        )?;
        Ok(st.query_map(params![packet], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?)
    }

    /// The grabs stored under `name`: user and amount.
    pub fn claims(&self, name: &str) -> Result<Vec<(String, i64)>, Error> {
        let mut st = self.db.prepare_cached("SELECT user, amount FROM claims WHERE packet = ?1 ORDER BY user")?;
        Ok(st.query_map(params![name], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?)
    }

    /// Position of the next grab record to copy for `packet`.
    pub fn cursor(&self, packet: &str) -> Result<i64, Error> {
        let mut st = self.db.prepare_cached("SELECT next FROM cursors WHERE packet = ?1")?;
        let mut rows = st.query(params![packet])?;
        Ok(match rows.next()? {
            Some(r) => r.get(0)?,
            None => 0,
        })
    }

    /// Inserts grab records `claims` (found at positions `from..`) and advances the cursor, atomically.
    pub fn commit(&mut self, packet: &str, from: i64, claims: &[GrabRecord]) -> Result<(), Error> {
        let tx = self.db.transaction()?;
        {
            let mut ins = tx.prepare_cached(
                "INSERT OR IGNORE INTO claims (packet, user, amount, idx, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for c in claims {
                ins.execute(params![packet, c.user, c.amount, c.index, c.at_ms])?;
            }
            tx.execute(
                "INSERT INTO cursors (packet, next) VALUES (?1, ?2) ON CONFLICT(packet) DO UPDATE SET next = excluded.next",
                params![packet, from + claims.len() as i64],
            )
            ?;
        }
        Ok(tx.commit()?)
    }

    /// ReadGrabs stored for `packet`: (count, sum of amounts).
    pub fn totals(&self, packet: &str) -> Result<(i64, i64), Error> {
        Ok(self.db.query_row(
            "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM claims WHERE packet = ?1",
            params![packet],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }
}

/// Copies every grab record of `packet` (in namespace `ns`) not yet stored, under the name
/// [`Store::generation`] gives the packet Redis holds now. Returns how many were copied. One
/// store holds one namespace's packets (ids are unique only within one).
pub async fn drain_packet(
    redis: &Direct,
    ns: &Namespace,
    store: &mut Store,
    packet: &str,
    batch: i64,
) -> Result<u64, Error> {
    let created = || async {
        Ok::<_, Error>(redis.run(&Namespaced::new(ReadStatus::new(packet)?, ns.clone())).await?.map(|s| s.created_ms))
    };
    let mut copied = 0;
    loop {
        // The packet's creation time read before and after each batch of its log (two calls:
        // the log is read apart from it): a batch read while the id was made again may be
        // the new packet's log, read from the old one's cursor, and is read again.
        let before = created().await?;
        let name = store.generation(packet, before)?;
        let from = store.cursor(&name)?;
        let claims = redis.run(&Namespaced::new(ReadGrabs::new(packet, from, batch)?, ns.clone())).await?;
        if created().await? != before {
            continue;
        }
        if claims.is_empty() {
            return Ok(copied);
        }
        store.commit(&name, from, &claims)?;
        copied += claims.len() as u64;
    }
}

/// Ids of the packets in namespace `ns` that have a grab log, found with SCAN (an admin tool
/// may scan) on the server, or on every master of a Redis Cluster (each log is then read from
/// the master that serves it). Sorted, each once.
pub async fn packets(redis: &Direct, ns: &Namespace) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for key in redis.scan(&ns.redpacket_logs()).await? {
        // A key that is not UTF-8 matched the pattern but is no packet's log.
        if let Some(id) = std::str::from_utf8(&key).ok().and_then(|k| ns.redpacket_of_log(k)) {
            out.push(id.to_string());
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Whether Redis still knows `packet` in namespace `ns` (its grabs can still grow).
pub async fn packet_live(redis: &Direct, ns: &Namespace, packet: &str) -> Result<bool, Error> {
    Ok(redis.run(&Namespaced::new(ReadStatus::new(packet)?, ns.clone())).await?.is_some())
}
