//! Arbitrary bytes as a virtio-vsock tx queue: packets may be dropped or
//! connections reset, the device never panics, hangs or grows without bound.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vmm_core::devices::virtio::fuzz::vsock_queue(data);
});
