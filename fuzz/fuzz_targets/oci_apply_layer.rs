//! An image layer of arbitrary bytes applied to a tree: nothing outside the destination exists or changed.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::oci_apply_layer(data);
});
