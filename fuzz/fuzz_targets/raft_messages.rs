#![no_main]
//! See `tessera_testkit::fuzz::raft_messages`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_testkit::fuzz::raft_messages(data));
