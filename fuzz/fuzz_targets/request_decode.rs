//! Any bytes as a request frame, decoded and checked the way a server does before touching its
//! state: prefix bounds (authenticated and before hello), the JSON header into an envelope
//! (regions checked as they decode), then the stateless checks, and for a valid end of step the
//! merge into a step index. Must return a request or an error, never panic.
//! Run: `cargo +nightly fuzz run request_decode -- -max_total_time=60`.
#![no_main]

use cairn_core::index::StepIndex;
use cairn_proto::frame::decode;
use cairn_proto::{Envelope, Request, ServerRequest, MAX_HEADER, MAX_HELLO};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<Envelope>(data, MAX_HELLO, 0);
    // A client's connection decodes clients' requests; a peer's, any server's.
    let _ = decode::<Envelope>(data, MAX_HEADER, 1 << 20);
    if let Ok((env, payload, _)) = decode::<Envelope<ServerRequest>>(data, MAX_HEADER, 1 << 20) {
        if cairn_server::cmd::check(&env.req, payload.len() as u64).is_ok() {
            if let ServerRequest::Client(Request::EndStep { fragment, .. }) = env.req {
                let _ = StepIndex::merge(fragment.step, vec![fragment]);
            }
        }
    }
});
