#![no_main]
//! See `tessera_testkit::fuzz::trace_csv`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_testkit::fuzz::trace_csv(data));
