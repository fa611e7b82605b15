//! Arbitrary virtio-mmio register accesses, then the transport's saved
//! state and a state decoded from the input restored into fresh ones:
//! never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    vmm_core::devices::virtio::fuzz::mmio_registers(data);
});
