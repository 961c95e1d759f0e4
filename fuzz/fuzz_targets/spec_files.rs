#![no_main]
//! See `tessera_testkit::fuzz::spec_files`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_testkit::fuzz::spec_files(data));
