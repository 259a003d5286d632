//! Scripts written for Upstash on real Redis.
//!
//! Upstash accepts a first line `#!lua flags=allow-key-locking` that real Redis refuses
//! (`ERR Unexpected flag in script shebang`). The front removes that one flag before Redis
//! sees the script, and remembers which SHA the client knows (of its own text) and which
//! SHA Redis knows (of the rewritten text), so the client's EVALSHA keeps working.

use std::collections::HashMap;
use std::sync::Mutex;

use redcount_core::sha1;

const FLAG: &str = "allow-key-locking";
/// Most remembered rewrites, and most bytes of their sources; past either the map starts
/// again (clients then EVAL once more). Bytes, not only entries: one source may be 1 MiB.
const MAX_ENTRIES: usize = 10_000;
const MAX_BYTES: usize = 8 * 1024 * 1024;

/// What Redis knows for a script the client knows by another SHA.
#[derive(Clone)]
pub struct Rewritten {
    pub sha: String,
    pub source: Vec<u8>,
}

#[derive(Default)]
pub struct Scripts {
    by_client_sha: Mutex<Map>,
    /// How many rewrites are remembered (changed under the lock): most calls look up a SHA
    /// while none is, and skip the lock.
    known: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Map {
    entries: HashMap<String, Rewritten>,
    bytes: usize,
}

pub fn sha_hex(data: &[u8]) -> String {
    String::from_utf8(sha1::hex(sha1::digest(data)).to_vec()).unwrap_or_default()
}

/// The script without the flag, or `None` when it does not carry it.
pub fn rewrite(source: &[u8]) -> Option<Vec<u8>> {
    let end = source.iter().position(|&b| b == b'\n').unwrap_or(source.len());
    let first = std::str::from_utf8(&source[..end]).ok()?;
    let rest = first.strip_prefix("#!lua")?;
    if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let mut changed = false;
    let mut words = vec![String::from("#!lua")];
    for word in rest.split_whitespace() {
        match word.strip_prefix("flags=") {
            Some(list) => {
                let kept: Vec<&str> = list.split(',').filter(|f| *f != FLAG).collect();
                changed |= kept.len() != list.split(',').count();
                if !kept.is_empty() && kept != [""] {
                    words.push(format!("flags={}", kept.join(",")));
                }
            }
            None => words.push(word.to_string()),
        }
    }
    if !changed {
        return None;
    }
    let mut out = words.join(" ").into_bytes();
    out.extend_from_slice(&source[end..]);
    Some(out)
}

impl Scripts {
    /// Rewrites a script about to be sent with EVAL or SCRIPT LOAD; returns the client's SHA
    /// and what Redis will know when it was rewritten. Nothing is remembered yet: call
    /// [`Scripts::learn`] once Redis accepted the script, so a refused script can never be
    /// looked up later.
    pub fn prepare_source(&self, source: &mut Vec<u8>) -> Option<(String, Rewritten)> {
        let new = rewrite(source)?;
        let client_sha = sha_hex(source);
        let entry = Rewritten { sha: sha_hex(&new), source: new.clone() };
        *source = new;
        Some((client_sha, entry))
    }

    /// Remembers a rewrite Redis accepted.
    pub fn learn(&self, client_sha: String, rw: Rewritten) {
        let mut map = self.by_client_sha.lock().unwrap_or_else(|e| e.into_inner());
        if map.entries.contains_key(&client_sha) {
            return;
        }
        let size = client_sha.len() + rw.sha.len() + rw.source.len();
        if size > MAX_BYTES {
            return;
        }
        if map.entries.len() >= MAX_ENTRIES || map.bytes + size > MAX_BYTES {
            map.entries.clear();
            map.bytes = 0;
        }
        map.bytes += size;
        map.entries.insert(client_sha, rw);
        self.known.store(map.entries.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The Redis-side script for a SHA the client sent, if it is a rewritten one.
    pub fn lookup(&self, client_sha: &[u8]) -> Option<Rewritten> {
        if self.known.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return None;
        }
        let key = String::from_utf8_lossy(client_sha).to_ascii_lowercase();
        self.by_client_sha.lock().unwrap_or_else(|e| e.into_inner()).entries.get(&key).cloned()
    }

    /// Bytes held by the remembered rewrites.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.by_client_sha.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// SCRIPT FLUSH: forget everything, as Redis does.
    pub fn clear(&self) {
        let mut map = self.by_client_sha.lock().unwrap_or_else(|e| e.into_inner());
        map.entries.clear();
        map.bytes = 0;
        self.known.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_BYTES, Scripts, rewrite};

    #[test]
    fn learns_only_when_told_and_stays_within_its_byte_bound() {
        let scripts = Scripts::default();
        let mut src = b"#!lua flags=allow-key-locking\nreturn 1".to_vec();
        let (client, rw) = scripts.prepare_source(&mut src).unwrap();
        assert!(scripts.lookup(client.as_bytes()).is_none(), "nothing is remembered before Redis accepts");
        scripts.learn(client.clone(), rw);
        assert!(scripts.lookup(client.as_bytes()).is_some());
        for i in 0..40 {
            let mut big = format!("#!lua flags=allow-key-locking\n-- {i}\n").into_bytes();
            big.resize(512 * 1024, b' ');
            let (c, rw) = scripts.prepare_source(&mut big).unwrap();
            scripts.learn(c, rw);
            assert!(scripts.bytes() <= MAX_BYTES, "{} bytes after {i}", scripts.bytes());
        }
    }

    #[test]
    fn removes_only_the_upstash_flag() {
        let r = |s: &str| rewrite(s.as_bytes()).map(|v| String::from_utf8(v).unwrap());
        assert_eq!(r("#!lua flags=allow-key-locking\nreturn 1").as_deref(), Some("#!lua\nreturn 1"));
        assert_eq!(
            r("#!lua flags=no-writes,allow-key-locking\nreturn 1").as_deref(),
            Some("#!lua flags=no-writes\nreturn 1")
        );
        assert_eq!(r("#!lua name=x flags=allow-key-locking").as_deref(), Some("#!lua name=x"));
        assert_eq!(r("#!lua flags=no-writes\nreturn 1"), None);
        assert_eq!(r("return 1"), None);
        assert_eq!(r("#!luax flags=allow-key-locking"), None);
    }
}
