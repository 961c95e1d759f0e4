//! The `History` read: a request checked and bounded into a [`history::Query`], answered from
//! the replica's history of ended jobs (`tessera_replica::history`) on its driver.

use crate::error::ViewServerError;
use crate::usage::MAX_USAGE_TENANTS;
use tessera_proto::tls::{Identity, Role};
use tessera_proto::v1;
use tessera_replica::history::{self, Cursor, MAX_PAGE};
use tessera_view::JobId;

/// Jobs a page holds when the request names no limit.
pub const DEFAULT_HISTORY_PAGE: usize = 1_000;

/// Checks `r` for `who`: a user reads its own tenants only (all of them when it names none).
pub fn query(who: &Identity, r: v1::HistoryRequest) -> Result<history::Query, ViewServerError> {
    if r.tenants.len() > MAX_USAGE_TENANTS {
        return Err(ViewServerError::Invalid(format!(
            "at most {MAX_USAGE_TENANTS} tenants per request, got {}",
            r.tenants.len()
        )));
    }
    let limit = match r.limit as usize {
        0 => DEFAULT_HISTORY_PAGE,
        n if n > MAX_PAGE => return Err(ViewServerError::Invalid(format!("limit is at most {MAX_PAGE}, got {n}"))),
        n => n,
    };
    let tenants = match (who.role, r.tenants.is_empty()) {
        (Role::User, true) => Some(who.tenants.clone()),
        (_, true) => None,
        (_, false) => Some(r.tenants),
    };
    Ok(history::Query {
        from_ms: r.from_ms,
        to_ms: r.to_ms,
        tenants,
        user: (!r.user.is_empty()).then_some(r.user),
        after: (r.after_job != 0).then_some(Cursor { ended_ms: r.after_ended_ms, job: JobId(r.after_job) }),
        limit,
    })
}

/// The answer for a page.
pub fn response(page: &history::Page) -> v1::HistoryResponse {
    let next = page.next.unwrap_or_default();
    v1::HistoryResponse {
        jobs: page.jobs.iter().map(v1::Job::from).collect(),
        next_after_ended_ms: next.ended_ms,
        next_after_job: next.job.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_reads_its_tenants_and_pages_are_bounded() {
        let ana = Identity { role: Role::User, name: "ana".into(), tenants: vec!["vision".into()] };
        let q = query(&ana, v1::HistoryRequest::default()).expect("valid");
        assert_eq!((q.tenants, q.limit, q.after), (Some(vec!["vision".to_string()]), DEFAULT_HISTORY_PAGE, None));
        let admin = Identity { role: Role::Admin, name: "root".into(), tenants: vec![] };
        let r = v1::HistoryRequest { after_ended_ms: 5, after_job: 9, user: "bo".into(), ..Default::default() };
        let q = query(&admin, r).expect("valid");
        assert_eq!((q.tenants, q.user.as_deref()), (None, Some("bo")));
        assert_eq!(q.after, Some(Cursor { ended_ms: 5, job: JobId(9) }));
        let big = v1::HistoryRequest { limit: MAX_PAGE as u32 + 1, ..Default::default() };
        assert!(query(&admin, big).is_err());
        let many = v1::HistoryRequest { tenants: vec!["t".into(); MAX_USAGE_TENANTS + 1], ..Default::default() };
        assert!(query(&admin, many).is_err());
    }
}
