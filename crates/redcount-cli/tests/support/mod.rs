//! What the in-process tests of `redcount serve`'s app share: a redis-server of their own,
//! and Redis byte for byte.

#![allow(dead_code)] // (each test file uses what it needs)

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Everything Redis holds: each key's DUMP and exact expiry (PEXPIRETIME), the key count, and
/// DEBUG DIGEST.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub keys: BTreeMap<Vec<u8>, (Vec<u8>, i64)>,
    pub dbsize: i64,
    pub digest: String,
}

pub fn snapshot(c: &mut redis::Connection) -> Snapshot {
    let names: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    let mut keys = BTreeMap::new();
    for k in names {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&k).query(c).unwrap();
        let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(c).unwrap();
        if let Some(dump) = dump {
            keys.insert(k, (dump, at));
        }
    }
    let dbsize = redis::cmd("DBSIZE").query(c).unwrap();
    let digest = redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap();
    Snapshot { keys, dbsize, digest }
}

/// The keys of `b` that differ from `a`'s, by name.
pub fn diff(a: &Snapshot, b: &Snapshot) -> Vec<String> {
    let names: BTreeSet<&Vec<u8>> = a.keys.keys().chain(b.keys.keys()).collect();
    names
        .into_iter()
        .filter(|k| a.keys.get(*k) != b.keys.get(*k))
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect()
}

pub struct Server {
    _proc: redcount_procs::Proc,
    dir: PathBuf,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn server() -> Server {
    let dir = redcount_procs::scratch_dir("no-change");
    let (proc, port) = redcount_procs::start_server(&dir, &["--enable-debug-command", "local"]).unwrap();
    Server { _proc: proc, dir, url: format!("redis://127.0.0.1:{port}/") }
}
