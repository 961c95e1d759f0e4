//! The `Usage` read: a request checked and bounded into a [`UsageQuery`], answered from the
//! view's ledger and jobs ([`ClusterView::usage_report`]) on the replica's driver.

use crate::error::ViewServerError;
use tessera_proto::convert::usage_response;
use tessera_proto::tls::{Identity, Role};
use tessera_proto::v1;
use tessera_view::{ClusterView, UsageBy};

/// Rows a report holds when the request names no limit.
pub const DEFAULT_USAGE_ROWS: usize = 1_000;
/// The most rows one report holds.
pub const MAX_USAGE_ROWS: usize = 10_000;
/// The most tenants one request names.
pub const MAX_USAGE_TENANTS: usize = 64;

/// A checked usage request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageQuery {
    /// From, Unix ms.
    pub from_ms: u64,
    /// Until, Unix ms (resolved: never 0).
    pub to_ms: u64,
    /// The grouping.
    pub by: UsageBy,
    /// Only these tenants (`None`: all).
    pub tenants: Option<Vec<String>>,
    /// At most this many rows.
    pub limit: usize,
    /// The present, for placements still held (Unix ms).
    pub now_ms: u64,
}

impl UsageQuery {
    /// Checks `r` for `who` at `now_ms`: `to_ms` 0 is now; a user reads its own tenants only
    /// (all of them when it names none). The tenants the caller names are returned for the
    /// authorization check.
    pub fn new(who: &Identity, r: v1::UsageRequest, now_ms: u64) -> Result<UsageQuery, ViewServerError> {
        // A range that ends before it starts is empty, not an error.
        let to_ms = if r.to_ms == 0 { now_ms } else { r.to_ms }.max(r.from_ms);
        let by = if r.by.is_empty() { UsageBy::Tenant } else { r.by.parse().map_err(ViewServerError::Invalid)? };
        if r.tenants.len() > MAX_USAGE_TENANTS {
            return Err(ViewServerError::Invalid(format!(
                "at most {MAX_USAGE_TENANTS} tenants per request, got {}",
                r.tenants.len()
            )));
        }
        let limit = match r.limit as usize {
            0 => DEFAULT_USAGE_ROWS,
            n if n > MAX_USAGE_ROWS => {
                return Err(ViewServerError::Invalid(format!("limit is at most {MAX_USAGE_ROWS}, got {n}")));
            }
            n => n,
        };
        let tenants = match (who.role, r.tenants.is_empty()) {
            (Role::User, true) => Some(who.tenants.clone()),
            (_, true) => None,
            (_, false) => Some(r.tenants),
        };
        Ok(UsageQuery { from_ms: r.from_ms, to_ms, by, tenants, limit, now_ms })
    }

    /// The report, read from `view`.
    pub fn answer(&self, view: &ClusterView) -> v1::UsageResponse {
        let report =
            view.usage_report(self.from_ms, self.to_ms, self.by, self.now_ms, self.tenants.as_deref(), self.limit);
        usage_response(&report, view.version().0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(tenants: &[&str]) -> Identity {
        Identity { role: Role::User, name: "ana".into(), tenants: tenants.iter().map(|t| t.to_string()).collect() }
    }

    #[test]
    fn a_user_reads_its_tenants_and_bad_ranges_are_refused() {
        let q = UsageQuery::new(&user(&["vision"]), v1::UsageRequest::default(), 5_000).expect("valid");
        assert_eq!((q.to_ms, q.by, q.tenants.as_deref()), (5_000, UsageBy::Tenant, Some(&["vision".to_string()][..])));
        let admin = Identity { role: Role::Admin, name: "root".into(), tenants: vec![] };
        let q = UsageQuery::new(&admin, v1::UsageRequest { by: "job".into(), ..Default::default() }, 1).expect("valid");
        assert_eq!((q.by, q.tenants), (UsageBy::Job, None));
        let bad = |r: v1::UsageRequest| UsageQuery::new(&admin, r, 10).expect_err("invalid").to_string();
        let q = UsageQuery::new(&admin, v1::UsageRequest { from_ms: 20, to_ms: 5, ..Default::default() }, 1)
            .expect("empty");
        assert_eq!((q.from_ms, q.to_ms), (20, 20), "an empty range");
        assert!(bad(v1::UsageRequest { by: "team".into(), ..Default::default() }).contains("tenant, user or job"));
        assert!(bad(v1::UsageRequest { limit: 10_001, ..Default::default() }).contains("at most 10000"));
        assert!(bad(v1::UsageRequest { tenants: vec!["t".into(); 65], ..Default::default() }).contains("at most 64"));
    }
}
