//! The REST front's request parsing: path-style segments, JSON commands and pipelines, the
//! refusal rules and the allow-key-locking rewrite, on arbitrary input.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(0);
    let path = std::str::from_utf8(&data[..split]).unwrap_or("/");
    redcount_front::fuzz_parse(path, &data[split..]);
});
