//! Arbitrary bytes as a virtio-net transmit queue, and a frame from the
//! host: the device may drop frames, never panic or hang.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vmm_core::devices::virtio::fuzz::net_queue(data);
});
