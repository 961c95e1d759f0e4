//! raft-rs logs through `slog`; this drain forwards its records to `tracing` (target `raft`).

use slog::{Drain, Level, Never, OwnedKVList, Record};

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, _: &OwnedKVList) -> Result<(), Never> {
        let msg = record.msg().to_string();
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}"),
            Level::Warning => tracing::warn!(target: "raft", "{msg}"),
            // raft-rs logs every election and step at info; keep them out of operators' logs.
            Level::Info => tracing::debug!(target: "raft", "{msg}"),
            Level::Debug | Level::Trace => tracing::trace!(target: "raft", "{msg}"),
        }
        Ok(())
    }
}

/// A logger for `RawNode::new` that writes to `tracing`.
pub fn raft_logger(replica: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("replica" => replica))
}
