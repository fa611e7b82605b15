//! A byte stream as an agent sends: frames read and their JSON decoded as responses and requests until the stream ends or a frame is refused.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::agent_frames(data);
});
