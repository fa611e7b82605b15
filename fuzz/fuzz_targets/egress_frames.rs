//! Arbitrary bytes as Ethernet frames through the egress filter, both
//! ways (malformed Ethernet, IP, TCP, UDP and DNS): never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vmm_core::devices::virtio::fuzz::egress_frames(data);
});
