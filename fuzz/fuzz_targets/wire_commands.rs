#![no_main]
//! See `tessera_testkit::fuzz::wire_commands`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_testkit::fuzz::wire_commands(data));
