//! [`JobTrace`]: the distributed trace a job belongs to.
//!
//! A job's submission starts (or continues) a trace; the leader that admits the job writes the
//! trace id and the span of its admission into the [`crate::Command::Submit`] it proposes, so
//! every replica holds the same value. Whoever acts on the job later — the scheduler host that
//! places it, the approver, the agents that start its tasks — parents its own spans on this one,
//! whichever process it runs in and however long after, and a tracing back end shows the job's
//! path from submission to task start as one trace.
//!
//! The ids are the W3C Trace Context's: a 16-byte trace id and an 8-byte span id, neither all
//! zeros. The core only carries them; making and exporting spans is the edges' business.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A trace id and the span a job's admission was recorded under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JobTrace {
    /// The W3C trace id; never 0.
    pub trace_id: u128,
    /// The span of the job's admission; never 0.
    pub span_id: u64,
}

impl JobTrace {
    /// A trace, unless either id is 0 (invalid in the W3C Trace Context).
    pub fn new(trace_id: u128, span_id: u64) -> Option<JobTrace> {
        (trace_id != 0 && span_id != 0).then_some(JobTrace { trace_id, span_id })
    }

    /// The trace id as 32 lower-case hex digits (how back ends show and search it).
    pub fn trace_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The W3C `traceparent` header naming the admission span as parent, sampled:
    /// `00-<trace id>-<span id>-01`.
    pub fn traceparent(&self) -> String {
        format!("00-{:032x}-{:016x}-01", self.trace_id, self.span_id)
    }
}

/// `<trace id>-<span id>` in hex; what the log entries and snapshots hold.
impl fmt::Display for JobTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}-{:016x}", self.trace_id, self.span_id)
    }
}

impl FromStr for JobTrace {
    type Err = String;

    fn from_str(s: &str) -> Result<JobTrace, String> {
        let bad = || format!("`{s}` is not <32 hex digits>-<16 hex digits> with neither all zeros");
        let (t, sp) = s.split_once('-').ok_or_else(bad)?;
        if t.len() != 32 || sp.len() != 16 || !t.bytes().chain(sp.bytes()).all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let trace_id = u128::from_str_radix(t, 16).map_err(|_| bad())?;
        let span_id = u64::from_str_radix(sp, 16).map_err(|_| bad())?;
        JobTrace::new(trace_id, span_id).ok_or_else(bad)
    }
}

impl Serialize for JobTrace {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JobTrace {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JobTrace, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_round_trips_through_its_text_and_refuses_zero_or_malformed_ids() {
        let t = JobTrace::new(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736, 0x00f0_67aa_0ba9_02b7).expect("valid");
        assert_eq!(t.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7");
        assert_eq!(t.traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(t.to_string().parse::<JobTrace>(), Ok(t));
        // Through serde, as log entries and snapshots carry it (TOML here: the core's format).
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Holder {
            trace: JobTrace,
        }
        let text = toml::to_string(&Holder { trace: t }).expect("encode");
        assert_eq!(toml::from_str::<Holder>(&text).expect("decode"), Holder { trace: t });
        assert!(toml::from_str::<Holder>("trace = '1-2'").is_err());
        assert_eq!(JobTrace::new(0, 1), None);
        assert_eq!(JobTrace::new(1, 0), None);
        for bad in [
            "",
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "00000000000000000000000000000000-00f067aa0ba902b7",
            "4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000",
            "4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7",
            "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b",
            "4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7",
            "+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert!(bad.parse::<JobTrace>().is_err(), "{bad} accepted");
        }
    }
}
