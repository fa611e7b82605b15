//! A VMM control socket line, parsed as a request and as a response.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::control_line(data);
});
