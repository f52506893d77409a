//! Any bytes from the network: decoding must return a frame or an error, never panic or allocate
//! beyond the bounds. Run: `cargo +nightly fuzz run frame_decode -- -max_total_time=60`.
#![no_main]

use cairn_proto::frame::decode;
use cairn_proto::{Request, Response, MAX_HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<Request>(data, MAX_HEADER, 1 << 20);
    let _ = decode::<Response>(data, MAX_HEADER, 1 << 20);
});
