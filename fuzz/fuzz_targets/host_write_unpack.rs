//! copy_out's unpacker on arbitrary archive bytes (the first byte's low bit asks for git metadata): nothing outside the destination exists or changed.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    testkit::fuzz::host_write_unpack(data);
});
