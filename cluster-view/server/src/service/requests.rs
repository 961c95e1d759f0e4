//! Requests that become one view command, converted and checked before they reach the driver:
//! a cordon, a layout change, an agent's address, the name a submitter is kept under.

use crate::error::ViewServerError;
use tessera_proto::tls::{Identity, Role};
use tessera_proto::v1;
use tessera_view::server::MAX_CORDON_REASON_CHARS;
use tessera_view::{Command, ConfigSetId, Cordon, ServerId, Topology};

/// Longest drain a request may ask for: 30 days.
pub const MAX_DRAIN_TIMEOUT_S: u64 = 30 * 24 * 3600;

/// The command of a [`v1::CordonServerRequest`] at `now_ms` (Unix ms on the leader), or why the
/// request is malformed.
pub fn cordon_command(r: &v1::CordonServerRequest, now_ms: u64) -> Result<Command, ViewServerError> {
    let server = ServerId(r.server);
    let bad = |m: String| ViewServerError::Invalid(format!("CordonServerRequest.{m}"));
    if r.reason.chars().count() > MAX_CORDON_REASON_CHARS {
        return Err(bad(format!("reason: at most {MAX_CORDON_REASON_CHARS} characters")));
    }
    if r.drain_timeout_s > MAX_DRAIN_TIMEOUT_S {
        return Err(bad(format!(
            "drain_timeout_s: {} s; at most {MAX_DRAIN_TIMEOUT_S} s (30 days)",
            r.drain_timeout_s
        )));
    }
    let cordon = |drain_by_ms| Cordon { reason: r.reason.clone(), since_ms: now_ms, drain_by_ms };
    match v1::CordonAction::try_from(r.action) {
        Ok(v1::CordonAction::Cordon) if r.drain_timeout_s == 0 => Ok(Command::Cordon { server, cordon: cordon(None) }),
        Ok(v1::CordonAction::Cordon) => Err(bad("drain_timeout_s: only a drain has a timeout".into())),
        Ok(v1::CordonAction::Drain) => {
            Ok(Command::Cordon { server, cordon: cordon(Some(now_ms.saturating_add(r.drain_timeout_s * 1000))) })
        }
        Ok(v1::CordonAction::Uncordon) => Ok(Command::Uncordon { server, at_ms: now_ms }),
        Ok(v1::CordonAction::Unspecified) | Err(_) => {
            Err(bad(format!("action: {} is not cordon, drain or uncordon", r.action)))
        }
    }
}

/// The command of a [`v1::LayoutRequest`] at `now_ms` (Unix ms on the leader), or why the
/// request is malformed. What the view checks (names, counts, ids, a topology's consistency
/// with the cluster's) it refuses at apply, the same on every replica.
pub fn layout_command(r: &v1::LayoutRequest, now_ms: u64) -> Result<Command, ViewServerError> {
    use v1::layout_request::Change;
    let bad = |m: String| ViewServerError::Invalid(format!("LayoutRequest.{m}"));
    let u16_id = |v: u32, field: &str| {
        u16::try_from(v).map(ConfigSetId).map_err(|_| bad(format!("{field}: {v} is not a configuration set id")))
    };
    match &r.change {
        None => {
            Err(bad("change: missing; give add_config_set, add_servers, remove_server or remove_config_set".into()))
        }
        Some(Change::AddConfigSet(a)) => {
            let topology = a.topology.clone().ok_or_else(|| bad("add_config_set.topology: missing".into()))?;
            let topology = Topology::try_from(topology).map_err(|e| bad(format!("add_config_set.topology: {e}")))?;
            Ok(Command::AddConfigSet {
                rack: a.rack.clone(),
                ib_domain: a.ib_domain.clone(),
                topology: Box::new(topology),
            })
        }
        Some(Change::AddServers(a)) => {
            if a.names.len() > tessera_view::layout::MAX_SERVERS_PER_ADD {
                return Err(bad(format!(
                    "add_servers.names: {} names; at most {}",
                    a.names.len(),
                    tessera_view::layout::MAX_SERVERS_PER_ADD
                )));
            }
            Ok(Command::AddServers {
                config_set: u16_id(a.config_set, "add_servers.config_set")?,
                names: a.names.clone(),
                at_ms: now_ms,
            })
        }
        Some(Change::RemoveServer(a)) => Ok(Command::RemoveServer { server: ServerId(a.server), at_ms: now_ms }),
        Some(Change::RemoveConfigSet(a)) => {
            Ok(Command::RemoveConfigSet { config_set: u16_id(a.config_set, "remove_config_set.config_set")? })
        }
    }
}

/// The command of a [`v1::PolicyRequest`], or why the request is malformed: no change, or a
/// tenant or class name the view would refuse (checked here, so it is the request's fault,
/// `INVALID_ARGUMENT`, not a refusal by the view). What depends on the view's state (how many
/// quotas or classes there are, the last class) the view refuses at apply.
pub fn policy_command(r: &v1::PolicyRequest) -> Result<Command, ViewServerError> {
    use v1::policy_request::Change;
    let bad = |e: tessera_view::ViewError| ViewServerError::Invalid(format!("PolicyRequest: {e}"));
    match &r.change {
        None => Err(ViewServerError::Invalid(
            "PolicyRequest.change: missing; give quota, priority_class or revocation".into(),
        )),
        Some(Change::Quota(q)) => {
            tessera_view::policy::check_name("tenant", &q.tenant).map_err(bad)?;
            let most = tessera_view::policy::MAX_QUOTA_GPUS;
            if q.gpus.is_some_and(|g| g > most) {
                return Err(ViewServerError::Invalid(format!(
                    "PolicyRequest.quota.gpus: at most {most}; remove the quota for no bound"
                )));
            }
            if let Some(class) = &q.class {
                tessera_view::policy::check_name("priority class", class).map_err(bad)?;
            }
            Ok(Command::SetQuota { tenant: q.tenant.clone(), gpus: q.gpus, class: q.class.clone() })
        }
        Some(Change::PriorityClass(c)) => {
            tessera_view::policy::check_name("priority class", &c.class).map_err(bad)?;
            Ok(Command::SetPriorityClass { class: c.class.clone(), priority: c.priority })
        }
        Some(Change::Revocation(r)) => {
            tessera_view::revocation::check_fingerprint(&r.fingerprint).map_err(bad)?;
            let revocation = match &r.revocation {
                None => None,
                Some(w) => {
                    let w = v1::Revocation { fingerprint: r.fingerprint.clone(), ..w.clone() };
                    let (_, entry) = tessera_proto::convert::revocation_from_wire(w)
                        .map_err(|e| ViewServerError::Invalid(format!("PolicyRequest.revocation: {e}")))?;
                    if entry.not_after_ms == 0 {
                        return Err(ViewServerError::Invalid(
                            "PolicyRequest.revocation.revocation.not_after_ms: required (the credential's own expiry, Unix ms)"
                                .into(),
                        ));
                    }
                    Some(entry)
                }
            };
            Ok(Command::SetRevocation { fingerprint: r.fingerprint.clone(), revocation })
        }
    }
}

/// An agent's address is `host:port`, at most 256 bytes, or empty.
pub(super) fn check_agent_addr(a: &str) -> Result<(), ViewServerError> {
    if a.is_empty() {
        return Ok(());
    }
    let ok = a.len() <= 256 && a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if ok { Ok(()) } else { Err(ViewServerError::Invalid(format!("agent_addr `{a}` is not host:port"))) }
}

/// The name a job's submitter is kept and charged under: a user's own name, any other
/// caller's role and name (`admin/root`, `scheduler/host-1`).
pub fn user_name(who: &Identity) -> String {
    match who.role {
        Role::User => who.name.clone(),
        role => format!("{role}/{}", who.name),
    }
}
