//! An image config of arbitrary bytes, parsed and its run settings
//! resolved against a small tree: nothing outside it exists or changed.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::oci_config(data);
});
