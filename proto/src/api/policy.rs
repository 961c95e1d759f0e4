//! The JSON of the cluster's policy: `GET /v1/policy`, `PUT` and `DELETE` of
//! `/v1/policy/quotas/{tenant}`, `/v1/policy/classes/{class}` and
//! `/v1/policy/revocations/{fingerprint}`, and what `tessera policy` prints with `--json`.

use serde::{Deserialize, Serialize};
use tessera_view::ViewSnapshot;
use utoipa::ToSchema;

/// One tenant's GPU quota and what it holds now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Quota {
    /// The tenant.
    pub tenant: String,
    /// GPUs its placed gangs may hold together.
    pub gpus: u32,
    /// GPUs its placed gangs hold now (more than `gpus` after the quota was lowered: jobs
    /// keep what they hold, and the tenant grows again only once back under it).
    pub held: u32,
}

/// One tenant's quota at a priority class and above, and what it holds there now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClassQuota {
    /// The tenant.
    pub tenant: String,
    /// The class: the quota bounds the tenant's jobs at its priority and above.
    pub class: String,
    /// GPUs those jobs may hold together.
    pub gpus: u32,
    /// GPUs they hold now (more than `gpus` after the quota was lowered, or the class's
    /// priority moved under running jobs: jobs keep what they hold).
    pub held: u32,
}

/// One priority class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PriorityClass {
    /// The class, as job specs name it (`priority_class`).
    pub class: String,
    /// Its priority: higher runs first and may preempt lower.
    pub priority: i32,
}

/// A revoked certificate or token (every replica and agent refuses it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Revoked {
    /// `sha256:` and 64 lowercase hex digits of the certificate's DER or the token's text.
    pub fingerprint: String,
    /// Who the credential names, as the admin gave it (`user/alice`).
    pub subject: String,
    /// When the credential itself expires, Unix ms; the entry leaves the list after it.
    pub not_after_ms: u64,
    /// Why it was revoked.
    pub note: String,
    /// The view's clock when it was revoked, Unix ms.
    pub at_ms: u64,
}

/// The policy in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Policy {
    /// The view version read.
    pub version: u64,
    /// Tenants' GPU quotas, by tenant; a tenant absent has no bound.
    pub quotas: Vec<Quota>,
    /// Tenants' quotas at a priority class and above, by tenant, then class.
    #[serde(default)]
    pub class_quotas: Vec<ClassQuota>,
    /// Priority classes, highest first.
    pub classes: Vec<PriorityClass>,
    /// A job preempted this many times is not preempted again (0: preemption is off).
    pub max_preemptions: u32,
    /// Revoked certificates and tokens, by fingerprint (like a CA's revocation list, public).
    #[serde(default)]
    pub revocations: Vec<Revoked>,
}

impl Policy {
    /// The policy of a view.
    pub fn of(s: &ViewSnapshot) -> Policy {
        let used = s.tenant_used();
        let quotas = s
            .quotas
            .iter()
            .map(|(t, &gpus)| Quota { tenant: t.clone(), gpus, held: used.get(t).copied().unwrap_or(0) })
            .collect();
        let mut classes: Vec<PriorityClass> =
            s.priorities.classes.iter().map(|(c, &priority)| PriorityClass { class: c.clone(), priority }).collect();
        classes.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.class.cmp(&b.class)));
        let by_rank = s.rank_used();
        let class_quotas = s
            .class_quotas
            .iter()
            .flat_map(|(t, classes)| classes.iter().map(move |(c, &gpus)| (t, c, gpus)))
            .map(|(t, c, gpus)| {
                let floor = s.priorities.classes.get(c).copied().unwrap_or(i32::MAX);
                let held = by_rank.get(t).map_or(0, |by| by.range(floor..).map(|(_, g)| g).sum());
                ClassQuota { tenant: t.clone(), class: c.clone(), gpus, held }
            })
            .collect();
        let revocations = s
            .revocations
            .iter()
            .map(|(fp, r)| Revoked {
                fingerprint: fp.clone(),
                subject: r.subject.clone(),
                not_after_ms: r.not_after_ms,
                note: r.note.clone(),
                at_ms: r.at_ms,
            })
            .collect();
        Policy {
            version: s.version.0,
            quotas,
            class_quotas,
            classes,
            max_preemptions: s.priorities.max_preemptions,
            revocations,
        }
    }
}

/// `PUT /v1/policy/quotas/{tenant}`: the tenant's quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    /// GPUs the tenant's placed gangs may hold together.
    #[schema(maximum = 1048576)]
    #[serde(deserialize_with = "whole")]
    pub gpus: u32,
}

/// `PUT /v1/policy/classes/{class}`: the class's priority.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassBody {
    /// Its priority: higher runs first and may preempt lower.
    #[serde(deserialize_with = "whole")]
    pub priority: i32,
}

/// `PUT /v1/policy/revocations/{fingerprint}`: the revoked credential's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevocationBody {
    /// Who the credential names (`user/alice`), for operators: at most 256 characters, no
    /// control characters.
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub subject: String,
    /// When the credential itself expires, Unix ms (`tessera tls revoke` reads it from the
    /// certificate or token): the entry leaves the list after it, so give the real expiry.
    #[schema(minimum = 1)]
    #[serde(deserialize_with = "whole")]
    pub not_after_ms: u64,
    /// Why: at most 256 characters, no control characters.
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub note: String,
}

/// A whole number of type `T`, written as JSON Schema's integers may be: `7500` or `7500.0`
/// (serde takes only the first for an integer type).
fn whole<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64>,
{
    use serde::de::Error;
    let n = serde_json::Number::deserialize(d)?;
    let whole = n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64));
    let v = whole.ok_or_else(|| D::Error::custom(format!("{n} is not a whole number")))?;
    T::try_from(v).map_err(|_| D::Error::custom(format!("{n} is out of range")))
}

/// What a policy change did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyChanged {
    /// What was done: `set-quota`, `remove-quota`, `set-class-quota`, `remove-class-quota`,
    /// `set-class`, `remove-class`, `revoke`, `unrevoke`.
    pub action: String,
    /// The tenant or class (`tenant/class` for a class quota), or the revoked fingerprint.
    pub name: String,
    /// The view version after it (unchanged when the change was in force already).
    pub version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{
        ClusterSpec, ClusterView, CoreMask, JobSpec, MemberPlacement, Proposal, ProposalId, ServerId, Topology,
    };

    #[test]
    fn the_policy_shows_quotas_with_what_tenants_hold_and_classes_highest_first() {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        let mut v = ClusterView::from_spec(&spec);
        v.set_quota("vision", Some(6)).expect("quota");
        v.set_quota("nlp", Some(2)).expect("quota");
        let job = v.submit(JobSpec { tenant: "vision".into(), ..JobSpec::simple("j", 1, 4) }).expect("admitted");
        let t = Topology::preset("seed-8gpu").expect("preset");
        let (cores, memory) = (t.cores() / t.devices, t.memory_mib / t.devices);
        let m = MemberPlacement {
            server: ServerId(0),
            gpus: 0b1111,
            cores: CoreMask::range(0, 4 * cores),
            memory_mib: 4 * memory,
        };
        let p = Proposal { id: ProposalId(1), job, members: vec![m], based_on: v.version() };
        assert!(v.propose(&p).is_placed());
        let got = Policy::of(&v.snapshot());
        let quotas: Vec<(&str, u32, u32)> = got.quotas.iter().map(|q| (q.tenant.as_str(), q.gpus, q.held)).collect();
        assert_eq!(quotas, vec![("nlp", 2, 0), ("vision", 6, 4)]);
        let classes: Vec<i32> = got.classes.iter().map(|c| c.priority).collect();
        assert!(classes.windows(2).all(|w| w[0] >= w[1]), "{classes:?}");
        assert_eq!(got.classes.len(), v.priorities().classes.len());
        assert_eq!(got.max_preemptions, v.priorities().max_preemptions);
    }

    #[test]
    fn bodies_take_whole_numbers_written_either_way_and_nothing_else() {
        let q = |t: &str| serde_json::from_str::<QuotaBody>(t).map(|b| b.gpus).map_err(|e| e.to_string());
        assert_eq!(q(r#"{"gpus": 7500}"#), Ok(7500));
        assert_eq!(q(r#"{"gpus": 7500.0}"#), Ok(7500));
        for bad in [r#"{"gpus": 1.5}"#, r#"{"gpus": -1}"#, r#"{"gpus": 4294967296}"#, r#"{"gpus": "8"}"#, "{}"] {
            assert!(q(bad).is_err(), "{bad}");
        }
        let c = |t: &str| serde_json::from_str::<ClassBody>(t).map(|b| b.priority).map_err(|e| e.to_string());
        assert_eq!((c(r#"{"priority": -5.0}"#), c(r#"{"priority": 500}"#)), (Ok(-5), Ok(500)));
        assert!(c(r#"{"priority": 2147483648}"#).is_err());
    }
}
