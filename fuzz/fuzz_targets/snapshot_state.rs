//! A snapshot state file (the first byte chooses raw bytes or a payload behind a valid header): decoded or refused, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::snapshot_state(data);
});
