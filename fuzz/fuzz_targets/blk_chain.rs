//! Arbitrary bytes as a virtio-blk queue (descriptor table, available ring,
//! buffers): the device may answer with error statuses, never panic or hang.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vmm_core::devices::virtio::fuzz::blk_queue(data);
});
