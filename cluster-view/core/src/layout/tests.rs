use crate::cluster_spec::ClusterSpec;
use crate::error::ViewError;
use crate::ids::{ConfigSetId, JobId, ProposalId, ServerId, ViewVersion};
use crate::invariants;
use crate::job::JobSpec;
use crate::layout::{LayoutChange, MAX_SERVERS_PER_ADD};
use crate::locality::LocalityLevel;
use crate::mask::CoreMask;
use crate::placement::{Decision, MemberPlacement, Proposal, Rejection};
use crate::server::{Cordon, Health};
use crate::topology::Topology;
use crate::view::{ClusterView, Command, Outcome};

/// Two seed-8gpu (V100) servers in `rack-0`, domain `ib-0`.
fn view() -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
    v.advance_clock(1_800_000_000_000);
    v
}

fn h100() -> Topology {
    Topology::preset("dgx-h100").expect("preset")
}

fn names(ns: &[&str]) -> Vec<String> {
    ns.iter().map(|n| n.to_string()).collect()
}

fn layout(v: &mut ClusterView, cmd: Command) -> Result<LayoutChange, ViewError> {
    match v.apply(&cmd) {
        Outcome::Layout(r) => r,
        o => panic!("unexpected outcome {o:?}"),
    }
}

fn add_set(v: &mut ClusterView, rack: &str, ib: &str, t: Topology) -> Result<ConfigSetId, ViewError> {
    layout(v, Command::AddConfigSet { rack: rack.into(), ib_domain: ib.into(), topology: Box::new(t) })
        .map(|c| c.config_set.expect("a set"))
}

fn add_servers(v: &mut ClusterView, cs: ConfigSetId, ns: &[&str]) -> Result<Vec<ServerId>, ViewError> {
    layout(v, Command::AddServers { config_set: cs, names: names(ns), at_ms: 7 }).map(|c| c.servers)
}

fn remove(v: &mut ClusterView, s: ServerId) -> Result<LayoutChange, ViewError> {
    layout(v, Command::RemoveServer { server: s, at_ms: 9 })
}

/// One member of one GPU on `server`, device 0, with its share of cores (four of a seed-8gpu,
/// fourteen of a dgx-h100).
fn propose(v: &mut ClusterView, job: JobId, id: u64, server: ServerId) -> Decision {
    let cs = v.server(server).map(|r| r.config_set);
    let cores = cs.map_or(4, |cs| v.topology_of(cs).cores() / v.topology_of(cs).devices);
    let m = MemberPlacement { server, gpus: 1, cores: CoreMask::range(0, cores), memory_mib: 1024 };
    let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: v.version() };
    match v.apply(&Command::Propose(vec![p])) {
        Outcome::Decided(mut d) => d.remove(0),
        o => panic!("unexpected outcome {o:?}"),
    }
}

fn one_gpu(gpu_type: Option<&str>) -> JobSpec {
    JobSpec { memory_mib_per_gpu: Some(1024), gpu_type: gpu_type.map(String::from), ..JobSpec::simple("j", 1, 1) }
}

fn assert_clean(v: &ClusterView) {
    let rep = invariants::check(v);
    assert!(rep.is_clean(), "{:?}", rep.violations);
}

#[test]
fn a_new_configuration_set_with_servers_admits_jobs_of_its_type_once_their_agents_come_up() {
    let mut v = view();
    let h100_job = one_gpu(Some("nvidia-h100-80g"));
    assert!(matches!(v.submit(h100_job.clone()), Err(ViewError::NeverFits(_))), "no H100 yet");
    let cs = add_set(&mut v, "rack-9", "ib-9", h100()).expect("added");
    assert_eq!(cs, ConfigSetId(1));
    assert_eq!(v.config_set_id("rack-9/dgx-h100"), Some(cs));
    assert_eq!(v.racks(), ["rack-0", "rack-9"]);
    assert_eq!(v.ib_domains(), ["ib-0", "ib-9"]);
    assert!(matches!(v.submit(h100_job.clone()), Err(ViewError::NeverFits(_))), "a set without servers hosts nothing");

    let added = add_servers(&mut v, cs, &["h100-a", "h100-b"]).expect("added");
    assert_eq!(added, vec![ServerId(2), ServerId(3)]);
    assert_eq!(v.server_id("h100-b"), Some(ServerId(3)));
    let rec = *v.server(ServerId(2)).expect("record");
    assert_eq!(rec.health, Health::Down, "down until its agent registers");
    assert_eq!(rec.free_gpus, h100().all_devices());
    assert!(v.health_history(ServerId(2)).any(|c| c.why.contains("added to configuration set `rack-9/dgx-h100`")));

    let job = v.submit(h100_job).expect("admitted now");
    match propose(&mut v, job, 1, ServerId(2)) {
        Decision::Rejected { reason: Rejection::ServerNotUp { health: Health::Down, .. }, .. } => {}
        d => panic!("placed on a server whose agent never came: {d:?}"),
    }
    v.set_health(ServerId(2), Health::Up).expect("its agent registered");
    assert!(propose(&mut v, job, 2, ServerId(2)).is_placed());
    assert_clean(&v);
}

#[test]
fn layout_commands_refuse_bad_input_whole_and_change_nothing() {
    let mut v = view();
    let before = v.state_hash();
    let version = v.version();
    let refused = |r: Result<ConfigSetId, ViewError>, what: &str| match r {
        Err(ViewError::Layout(m)) => assert!(m.contains(what), "`{m}` should say `{what}`"),
        r => panic!("expected a refusal saying `{what}`, got {r:?}"),
    };
    refused(add_set(&mut v, "rack-0", "ib-7", h100()), "rack `rack-0` is in InfiniBand domain `ib-0`");
    refused(add_set(&mut v, "rack-0", "ib-0", Topology::preset("seed-8gpu").expect("p")), "already exists");
    let mut clash = h100();
    clash.memory_mib /= 2;
    clash.name = "seed-8gpu".into();
    refused(add_set(&mut v, "rack-5", "ib-5", clash), "differs from the one of that name");
    refused(add_set(&mut v, "rack 5", "ib-5", h100()), "rack name");
    refused(add_set(&mut v, "rack-5", "", h100()), "InfiniBand domain name");
    let mut broken = h100();
    broken.devices = 0;
    refused(add_set(&mut v, "rack-5", "ib-5", broken), "topology `dgx-h100`");

    let servers = |r: Result<Vec<ServerId>, ViewError>, what: &str| match r {
        Err(ViewError::Layout(m)) => assert!(m.contains(what), "`{m}` should say `{what}`"),
        r => panic!("expected a refusal saying `{what}`, got {r:?}"),
    };
    let cs = ConfigSetId(0);
    servers(add_servers(&mut v, ConfigSetId(4), &["x"]), "no configuration set with id 4");
    servers(add_servers(&mut v, cs, &[]), "0 server names");
    servers(add_servers(&mut v, cs, &["ok-1", "rack-0-s01"]), "server `rack-0-s01` already exists");
    servers(add_servers(&mut v, cs, &["ok-1", "ok-1"]), "named twice");
    servers(add_servers(&mut v, cs, &["ok-1", "-bad"]), "must start with a letter or digit");
    servers(add_servers(&mut v, cs, &["ok/1"]), "only ASCII letters");
    let many: Vec<String> = (0..=MAX_SERVERS_PER_ADD).map(|i| format!("n{i}")).collect();
    let many = Command::AddServers { config_set: cs, names: many, at_ms: 0 };
    servers(layout(&mut v, many).map(|c| c.servers), "1025");
    assert!(matches!(remove(&mut v, ServerId(99)), Err(ViewError::UnknownServer(_))));
    assert!(matches!(
        layout(&mut v, Command::RemoveConfigSet { config_set: cs }),
        Err(ViewError::Layout(m)) if m.contains("still has 2 server(s)")
    ));
    assert_eq!((v.state_hash(), v.version()), (before, version), "every refusal left the view as it was");
    assert_eq!(v.servers().len(), 2);
}

#[test]
fn a_server_is_removed_only_once_empty_and_its_tombstone_offers_nothing() {
    let mut v = view();
    let s1 = ServerId(1);
    let job = v.submit(one_gpu(None)).expect("job");
    assert!(propose(&mut v, job, 1, s1).is_placed());
    match remove(&mut v, s1) {
        Err(ViewError::BadServer(s, m)) => {
            assert_eq!(s, s1);
            assert!(m.contains(&format!("still hosts job(s) {}", job.0)) && m.contains("drain it first"), "{m}");
        }
        r => panic!("removed a server with a gang on it: {r:?}"),
    }
    v.cordon(s1, Cordon { reason: "retire".into(), since_ms: 1, drain_by_ms: Some(2) }).expect("drain");
    v.evict(s1, 3).expect("deadline passed: the gang is re-queued");
    let version = v.version();
    remove(&mut v, s1).expect("empty now");
    assert_eq!(v.version().0, version.0 + 1, "one command, one version");
    let rec = *v.server(s1).expect("the tombstone stays");
    assert_eq!(rec.health, Health::Removed);
    assert_eq!((rec.free_gpus, rec.free_cores, rec.free_memory_mib), (0, CoreMask::EMPTY, 0));
    assert!(v.cordon_of(s1).is_none(), "its cordon went with it");
    assert_eq!(v.health_history(s1).last().map(|c| c.why.as_str()), Some("removed from the cluster"));
    assert_clean(&v);

    // Nothing acts on a tombstone.
    match propose(&mut v, job, 2, s1) {
        Decision::Rejected { reason: Rejection::ServerNotUp { health: Health::Removed, .. }, .. } => {}
        d => panic!("placed on a removed server: {d:?}"),
    }
    assert!(matches!(v.set_health(s1, Health::Up), Err(ViewError::BadServer(_, m)) if m.contains("removed")));
    assert!(matches!(v.set_health(ServerId(0), Health::Removed), Err(ViewError::BadServer(..))));
    assert!(matches!(v.set_unhealthy_devices(s1, 1), Err(ViewError::BadServer(..))));
    assert!(v.cordon(s1, Cordon { reason: "x".into(), since_ms: 4, drain_by_ms: None }).is_err());
    assert!(matches!(remove(&mut v, s1), Err(ViewError::BadServer(_, m)) if m.contains("already removed")));
    // The job still fits on server 0.
    assert!(propose(&mut v, job, 3, ServerId(0)).is_placed());
    assert_clean(&v);
}

#[test]
fn a_removal_drops_the_memo_of_what_fits() {
    let mut v = view();
    let two = JobSpec { members: 2, tolerate: LocalityLevel::Rack, ..JobSpec::simple("two", 2, 8) };
    v.submit(two.clone()).expect("two servers in one rack: fits (and is memoised)");
    remove(&mut v, ServerId(1)).expect("idle");
    assert!(matches!(v.submit(two), Err(ViewError::NeverFits(_))), "the memo of fits was dropped with the server");
}

#[test]
fn a_removed_name_may_be_added_again_as_a_new_server_and_ids_are_never_reused() {
    let mut v = view();
    let s1 = ServerId(1);
    let name = v.server_name(s1).expect("name").to_string();
    remove(&mut v, s1).expect("empty");
    assert_eq!(v.server_id(&name), Some(s1), "the name still finds the tombstone");
    let again = add_servers(&mut v, ConfigSetId(0), &[&name]).expect("the name is free again");
    assert_eq!(again, vec![ServerId(2)]);
    assert_eq!(v.server_id(&name), Some(ServerId(2)), "the name means the new server");
    assert_eq!(v.server(s1).expect("tombstone").health, Health::Removed);
    assert!(
        matches!(add_servers(&mut v, ConfigSetId(0), &[&name]), Err(ViewError::Layout(m)) if m.contains("already exists"))
    );
    // A snapshot keeps the newest meaning of the name and the same state.
    let back = ClusterView::from_snapshot(v.snapshot());
    assert_eq!(back.server_id(&name), Some(ServerId(2)));
    assert_eq!(back.state_hash(), v.state_hash());
    assert_eq!(v.free_server_names(ConfigSetId(0), 2), Some(names(&["rack-0-s02", "rack-0-s03"])));
    let free = v.free_server_names(ConfigSetId(0), 2).expect("a set");
    let change =
        layout(&mut v, Command::AddServers { config_set: ConfigSetId(0), names: free, at_ms: 1 }).expect("added");
    assert_eq!(change.names, names(&["rack-0-s02", "rack-0-s03"]));
    assert_eq!(change.servers, vec![ServerId(3), ServerId(4)]);
}

#[test]
fn a_configuration_set_is_removed_once_its_servers_are_and_its_name_is_free_again() {
    let mut v = view();
    let cs = add_set(&mut v, "rack-9", "ib-9", h100()).expect("added");
    let ids = add_servers(&mut v, cs, &["h-0"]).expect("added");
    assert!(matches!(layout(&mut v, Command::RemoveConfigSet { config_set: cs }), Err(ViewError::Layout(_))));
    remove(&mut v, ids[0]).expect("removed");
    layout(&mut v, Command::RemoveConfigSet { config_set: cs }).expect("now empty");
    assert!(v.config_sets()[cs.index()].removed);
    assert_eq!(v.config_set_id("rack-9/dgx-h100"), None);
    assert!(matches!(add_servers(&mut v, cs, &["h-1"]), Err(ViewError::Layout(m)) if m.contains("was removed")));
    assert!(matches!(v.submit(one_gpu(Some("nvidia-h100-80g"))), Err(ViewError::NeverFits(_))));
    let again = add_set(&mut v, "rack-9", "ib-9", h100()).expect("the name is free again");
    assert_eq!(again, ConfigSetId(2), "a new id");
    assert_eq!(v.topologies().len(), 2, "the equal topology was found, not added twice");
    assert_eq!(v.racks().len(), 2, "the rack too");
    assert_clean(&v);
    let back = ClusterView::from_snapshot(v.snapshot());
    assert_eq!(back.state_hash(), v.state_hash());
    assert_eq!(back.config_set_id("rack-9/dgx-h100"), Some(again));
}

#[test]
fn a_layout_change_sends_every_reader_behind_it_to_a_snapshot() {
    let mut v = view();
    let start = v.version();
    v.set_health(ServerId(0), Health::Down).expect("down");
    assert!(v.delta_since(start).is_some(), "the log reaches back before a layout change");
    add_servers(&mut v, ConfigSetId(0), &["extra"]).expect("added");
    let now = v.version();
    assert!(v.delta_since(start).is_none(), "a reader before the change must read the new layout whole");
    assert!(!v.for_each_changed_server(start, |_, _| {}));
    let d = v.delta_since(now).expect("a reader at the change is current");
    assert!(d.servers.is_empty() && d.jobs.is_empty());
    v.set_health(ServerId(2), Health::Up).expect("its agent registered");
    let d = v.delta_since(now).expect("later changes are deltas again");
    assert_eq!(d.servers.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![ServerId(2)]);
    assert!(v.delta_since(ViewVersion(now.0 - 1)).is_none());
}

#[test]
fn replicas_that_apply_the_same_layout_commands_agree_and_differ_from_those_that_did_not() {
    let cmds = vec![
        Command::AddConfigSet { rack: "rack-9".into(), ib_domain: "ib-0".into(), topology: Box::new(h100()) },
        Command::AddServers { config_set: ConfigSetId(1), names: names(&["a", "b"]), at_ms: 5 },
        Command::RemoveServer { server: ServerId(2), at_ms: 6 },
    ];
    let mut a = view();
    let mut b = view();
    for c in &cmds {
        a.apply(c);
        b.apply(c);
    }
    assert_eq!(a.state_hash(), b.state_hash());
    let mut c = view();
    for cmd in &cmds[..2] {
        c.apply(cmd);
    }
    assert_ne!(a.state_hash(), c.state_hash(), "a removal shows in the hash");
    let mut d = view();
    d.apply(&Command::AddConfigSet { rack: "rack-8".into(), ib_domain: "ib-0".into(), topology: Box::new(h100()) });
    let mut e = view();
    e.apply(&cmds[0]);
    assert_eq!(d.version(), e.version());
    assert_ne!(d.state_hash(), e.state_hash(), "the rack's name shows in the hash");
}

/// The cluster identity is `identity_hash` of the spec's view; it must stay what `state_hash`
/// gave before layouts could change (values computed by the release before, f8387ce), or every
/// data directory and peer of an existing cluster would be refused.
#[test]
fn the_identity_hash_of_a_spec_is_what_earlier_releases_computed() {
    let view = |preset: &str, servers, per_rack| {
        let t = Topology::preset(preset).expect("preset");
        ClusterView::from_spec(&ClusterSpec::uniform(t, servers, per_rack, 1))
    };
    assert_eq!(format!("{:016x}", view("seed-8gpu", 4, 2).identity_hash()), "9671461ef79122a0");
    assert_eq!(format!("{:016x}", view("dgx-h100", 6, 4).identity_hash()), "d8ace49a18af2f90");
    let v = view("seed-8gpu", 4, 2);
    assert_ne!(v.identity_hash(), v.state_hash(), "the state hash covers the layout's names too");
}
