//! The REST reply decoder (single and pipeline, both encodings) and every operation's reply
//! parser: arbitrary bytes from the network never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use redcount_core::rest::{Encoding, decode_pipeline, decode_reply};

fuzz_target!(|data: &[u8]| {
    let (status, body) = match data.split_first() {
        Some((s, rest)) => (200 + (*s as u16 % 4) * 100, rest),
        None => (200, data),
    };
    let _ = decode_pipeline(status, body, Encoding::Base64);
    let _ = decode_reply(status, body, Encoding::Plain);
    if let Ok(v) = decode_reply(status, body, Encoding::Base64) {
        use redcount_core::ops::*;
        let _ = redpacket::Grab::new("p", "u").unwrap().parse(v.clone());
        let _ = redpacket::ReadStatus::new("p").unwrap().parse(v.clone());
        let _ = redpacket::ReadGrabs::new("p", 0, 10).unwrap().parse(v.clone());
        let _ = inbox::Read::new("u", None, 10).unwrap().parse(v.clone());
        let _ = semaphore::UpdateLease::new("p", "n", semaphore::Action::Acquire, "h", 1, 1).unwrap().parse(v.clone());
        let algo = quota::Algorithm::FixedWindow { limit: 1, window_ms: 1 };
        let _ = quota::TakeQuota::take("p", "s", algo, 1).unwrap().parse(v.clone());
        let _ = counter::GetCounter::new("p", "s", counter::Storage::Key).unwrap().parse(v);
    }
});
