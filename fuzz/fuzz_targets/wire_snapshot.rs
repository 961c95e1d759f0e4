#![no_main]
//! See `tessera_testkit::fuzz::wire_snapshot`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_testkit::fuzz::wire_snapshot(data));
