//! `cargo xtask bench binding`: redcount as a user's Worker calls it. A caller worker taking
//! from a quota through the RPC binding, against a worker calling @upstash/ratelimit inline
//! (same front, same Redis, same limit and window), and the caller over public HTTP to the
//! redcount worker for reference; interleaved rounds at 1, 10 and 50 connections.

use std::cell::RefCell;
use std::fmt::Write as _;

use crate::procs::Guard;
use crate::setup::root;
use crate::workerd::{self, Prepared};

/// The section's heading in BENCHMARKS.md; `write` replaces the section under it.
const HEADING: &str = "## Measured as users call it: the RPC binding beside @upstash/ratelimit inline";

const CONNS: [u32; 3] = [1, 10, 50];
const ROUNDS: usize = 3;
const SECONDS: u32 = 3;

/// The workers the section runs, prepared by `bench::all`.
pub struct Parts<'a> {
    /// bench/caller-worker with the redcount worker behind its bindings.
    pub callers: &'a Prepared,
    /// The redcount worker alone, served on its port for the caller's public HTTP path.
    pub redcount: &'a Prepared,
    /// bench/ratelimit-worker, a limit of 500 an hour (bench-quota's).
    pub peer: &'a Prepared,
    /// The same with a limit of 1 (storm's).
    pub peer_one: &'a Prepared,
    /// The Redis every worker calls through the front.
    pub redis_port: u16,
}

/// One way of calling, under one load.
struct Caller<'a> {
    name: &'static str,
    worker: &'a Prepared,
    /// The path before the subject; `{tag}` becomes a tag fresh for each run.
    path: &'static str,
}

/// One run's figures: requests/s, then CPU per request (µs) of workerd (every isolate),
/// the front and Redis, then script calls and Redis commands per request.
type Run = [f64; 6];

/// CPU time so far of each process, in µs (0 for one gone).
fn cpu_of(pids: &[Option<u32>]) -> Vec<f64> {
    pids.iter().map(|p| p.and_then(workerd::cpu_us).unwrap_or(0.0)).collect()
}

/// Runs every caller of `load` at every connection count, the callers' order turning each
/// round; returns each caller's runs per connection count.
fn measure(parts: &Parts, load: &[Caller], one: bool, pids: &[Option<u32>; 3]) -> Result<Vec<Vec<Vec<Run>>>, String> {
    let mut runs = vec![vec![Vec::new(); CONNS.len()]; load.len()];
    for round in 0..ROUNDS {
        for (c, &conns) in CONNS.iter().enumerate() {
            for k in 0..load.len() {
                let k = (k + round) % load.len();
                let caller = &load[k];
                // Subjects fresh for each run: allowed traffic stays allowed.
                let path = caller.path.replace("{tag}", &format!("r{round}c{conns}"));
                let marks = RefCell::new(Vec::new());
                let (requests, workerd_cpu, (scripts, all)) =
                    workerd::under_load(caller.worker, &path, SECONDS, conns, one, &|| {
                        marks.borrow_mut().push(cpu_of(pids));
                        super::redis_calls(parts.redis_port)
                    })?;
                let marks = marks.into_inner();
                let grew = |i: usize| (marks[1][i] - marks[0][i]) / requests;
                let per = |n: u64| n as f64 / requests;
                // pids: the front, Redis, the redcount worker served for the public path.
                runs[k][c].push([
                    requests / f64::from(SECONDS),
                    workerd_cpu + grew(2),
                    grew(0),
                    grew(1),
                    per(scripts),
                    per(all),
                ]);
                eprintln!(
                    "xtask bench binding: {} · {conns} conns · round {round}: {:.0} req/s, {:.0} µs CPU per request",
                    caller.name,
                    requests / f64::from(SECONDS),
                    workerd_cpu + grew(0) + grew(1) + grew(2)
                );
            }
        }
    }
    Ok(runs)
}

fn col(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    workerd::median(&runs.iter().map(f).collect::<Vec<_>>())
}

fn total(r: &Run) -> f64 {
    r[1] + r[2] + r[3]
}

/// The table of one load, then the binding's ratios to the inline library (`load[0]` to
/// `load[1]`), each the median of the rounds' ratios.
fn tables(title: &str, load: &[Caller], runs: &[Vec<Vec<Run>>]) -> String {
    let mut t = format!(
        "{title}\n\n| caller | conns | requests/s | CPU per request | workerd | front | Redis | script calls per request | Redis commands per request | each run (req/s; CPU µs) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    );
    for (caller, per_conns) in load.iter().zip(runs) {
        for (c, r) in per_conns.iter().enumerate() {
            let each: Vec<String> = r.iter().map(|x| format!("{:.0}; {:.0}", x[0], total(x))).collect();
            let _ = writeln!(
                t,
                "| {} | {} | {:.0} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.2} | {:.2} | {} |",
                caller.name,
                CONNS[c],
                col(r, |x| x[0]),
                col(r, total),
                col(r, |x| x[1]),
                col(r, |x| x[2]),
                col(r, |x| x[3]),
                col(r, |x| x[4]),
                col(r, |x| x[5]),
                each.join(", ")
            );
        }
    }
    let _ = write!(
        t,
        "\n| {} / {} | conns | requests/s | CPU per request | goal | met |\n|---|---:|---:|---:|---|---|\n",
        load[0].name, load[1].name
    );
    for (c, conns) in CONNS.iter().enumerate() {
        let (speed, cpu) = ratios(&runs[0][c], &runs[1][c]);
        let _ = writeln!(
            t,
            "| | {conns} | {speed:.2}x | {cpu:.2}x | ≥ 1.0x requests/s | {} |",
            if speed >= 1.0 { "yes" } else { "no" }
        );
    }
    // The references' ratios: the floor (what no limiter behind a binding can pass) and
    // redcount's module in the caller's isolate (no hop).
    for f in (0..load.len()).filter(|&k| [FLOOR, INLINE_MODULE].contains(&load[k].name)) {
        let _ = write!(
            t,
            "\n| {} / {} | conns | requests/s | CPU per request |\n|---|---:|---:|---:|\n",
            load[f].name, load[1].name
        );
        for (c, conns) in CONNS.iter().enumerate() {
            let (speed, cpu) = ratios(&runs[f][c], &runs[1][c]);
            let _ = writeln!(t, "| | {conns} | {speed:.2}x | {cpu:.2}x |");
        }
    }
    t
}

/// Requests/s and CPU per request of `a` over `b`, each the median of the rounds' ratios.
fn ratios(a: &[Run], b: &[Run]) -> (f64, f64) {
    let ratio =
        |f: &dyn Fn(&Run) -> f64| workerd::median(&a.iter().zip(b).map(|(x, y)| f(x) / f(y)).collect::<Vec<_>>());
    (ratio(&|x| x[0]), ratio(&total))
}

/// The floor's row: a caller through a binding to a callee that makes one fetch and decides
/// nothing (bench/floor-worker's `Floor`).
const FLOOR: &str = "caller → binding floor (hop + one INCR, no decision)";

/// The row of redcount's engine in the caller's own isolate: no binding, no hop.
const INLINE_MODULE: &str = "redcount's engine in the caller (no hop)";

/// Measures both loads and returns the section, heading first.
pub fn section(parts: &Parts, front_and_redis: &[Option<u32>; 2]) -> Result<String, String> {
    // The redcount worker on its own port, for the public HTTP path (idle otherwise).
    let served: Guard = workerd::serve(parts.redcount)?;
    let pids = [front_and_redis[0], front_and_redis[1], served.id()];
    const BINDING: &str = "caller → RPC binding";
    const INLINE: &str = "@upstash/ratelimit inline";
    const PUBLIC: &str = "caller → public HTTP (reference)";
    let allowed = [
        Caller { name: BINDING, worker: parts.callers, path: "/rpc/bench-quota/b{tag}-" },
        Caller { name: INLINE, worker: parts.peer, path: "/cached/i{tag}-" },
        Caller { name: PUBLIC, worker: parts.callers, path: "/public/bench-quota/p{tag}-" },
        Caller { name: FLOOR, worker: parts.callers, path: "/floor/bench-quota/f{tag}-" },
        Caller { name: INLINE_MODULE, worker: parts.callers, path: "/inline/bench-quota/n{tag}-" },
    ];
    let exhausted = [
        Caller { name: BINDING, worker: parts.callers, path: "/rpc/storm/x" },
        Caller { name: INLINE, worker: parts.peer_one, path: "/cached/x" },
        Caller { name: PUBLIC, worker: parts.callers, path: "/public/storm/x" },
        Caller { name: INLINE_MODULE, worker: parts.callers, path: "/inline/storm/x" },
    ];
    let allowed_runs = measure(parts, &allowed, false, &pids)?;
    let exhausted_runs = measure(parts, &exhausted, true, &pids)?;
    // When, and of which commit (`+` when the tree had changes besides).
    let date = super::version("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let commit = super::version("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = std::process::Command::new("git")
        .args(["diff", "--quiet", "HEAD"])
        .current_dir(root())
        .status()
        .is_ok_and(|s| !s.success());
    let commit = if dirty { format!("{commit}+") } else { commit };
    Ok(format!(
        "{HEADING}\n\n\
         `cargo xtask bench binding` (and `cargo xtask bench`), last run {date} at {commit}. Under workerd, each load from\n\
         `bench/cpu-profile.mjs` (outside workerd) for {SECONDS} s a run; {ROUNDS} rounds, each running every\n\
         caller at every connection count, the callers' order turning each round; medians, and each run.\n\n\
         - **caller → RPC binding**: `bench/caller-worker` calling\n  \
         `new Redcount({{ binding: env.REDCOUNT }}).take(policy, subject)` (the typed client, made per\n  \
         request, its denial cache in the caller's isolate on as by default) through a Service\n  \
         binding to the redcount worker's `Redcount` entrypoint (both in one workerd).\n\
         - **@upstash/ratelimit inline**: `bench/ratelimit-worker`, the library in the worker itself, with\n  \
         its default ephemeral cache, fixed window.\n\
         - **caller → public HTTP**: the same caller `fetch`ing the redcount worker's\n  \
         `POST /api/quotas/…` (a plain fetch, no client), served by a second workerd on its own\n  \
         port: the path without a binding.\n\
         - **binding floor**: the same caller through a Service binding to `bench/floor-worker`'s\n  \
         `Floor` entrypoint, whose `take` makes one fetch to the front (an INCR) and decides nothing:\n  \
         the hop and a fetch, less than any limiter behind a binding can cost.\n\
         - **redcount's engine in the caller**: the same caller with redcount's engine in its own\n  \
         isolate (`new Redcount({{ binding: engine(env, ctx) }})`, the engine from\n  \
         `@redcount/client/engine`, on the caller's REDCOUNT_* vars): redcount run as a library,\n  \
         without the binding's hop.\n\n\
         Both sides use redcount-rest (one worker thread, a release build) and one Redis, and the same\n\
         policy: a fixed window of 500 an hour (`bench-quota`) for allowed traffic over fresh subjects\n\
         (1,000 per connection), a limit of 1 (`storm`) for the flood of one exhausted subject; each\n\
         with its defaults (redcount's `cache_denials_ms` 1000, the library's ephemeral cache).\n\
         CPU per request is workerd's (every isolate: caller and callee, and the second workerd of\n\
         the public path), the front's and Redis's, from `/proc`, over the requests answered; the\n\
         load generator's is not in it. Script calls are EVALSHA/EVAL round trips; Redis commands\n\
         count those run inside scripts too. On a machine shared with other work, requests per second\n\
         move with others' load between runs; CPU per request and the Redis calls are the stable\n\
         measures.\n\n\
         {}\n\
         {}",
        tables("Allowed traffic over many subjects:", &allowed, &allowed_runs),
        tables("A flood of one exhausted subject:", &exhausted, &exhausted_runs),
    ))
}

/// Replaces the section in BENCHMARKS.md.
pub fn write(section: &str) -> Result<(), String> {
    let path = root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    std::fs::write(&path, splice(&old, section)).map_err(|e| e.to_string())?;
    eprintln!("xtask: wrote the section \"{}\" of BENCHMARKS.md", &HEADING[3..]);
    Ok(())
}

/// `doc` with `section` in place of the one under [`HEADING`] (up to the next `## ` heading),
/// or before the sections measured by hand when it has none yet.
fn splice(doc: &str, section: &str) -> String {
    match doc.find(HEADING) {
        Some(at) => {
            let end = doc[at..].find("\n## ").map_or(doc.len(), |e| at + e + 1);
            let gap = if end < doc.len() { "\n" } else { "" };
            format!("{}{section}{gap}{}", &doc[..at], &doc[end..])
        }
        None => match doc.find(super::BY_HAND) {
            Some(at) => format!("{}\n{section}{}", &doc[..at], &doc[at..]),
            None => format!("{doc}\n{section}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_in_place() {
        let new = format!("{HEADING}\n\nnew table\n");
        let doc = format!("# B\n\n{HEADING}\n\nold table\n\n## Measured by hand: x\n\nkept\n");
        assert_eq!(splice(&doc, &new), format!("# B\n\n{new}\n## Measured by hand: x\n\nkept\n"));
        // Again: the same document.
        assert_eq!(splice(&splice(&doc, &new), &new), splice(&doc, &new));
        let first = splice("# B\n\nresults\n\n## Measured by hand: x\n", &new);
        assert_eq!(first, format!("# B\n\nresults\n\n{new}\n## Measured by hand: x\n"));
        assert_eq!(splice("# B\n", &new), format!("# B\n\n{new}"));
    }
}
