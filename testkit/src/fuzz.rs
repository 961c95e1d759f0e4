//! What Tessera reads from outside, fuzzed: the checks of the fuzz targets.
//!
//! One function per target of `fuzz/` (cargo fuzz, libFuzzer); `fuzz/fuzz_targets/*.rs` only
//! hand libFuzzer's bytes to them, so the workspace's tests replay the kept corpus
//! (`fuzz/corpus/<target>/`) without cargo fuzz (`tests/tests/fuzz_corpus.rs`). Each function
//! must return, whatever the bytes; a panic (an `assert!` below included) is a finding.
//!
//! | target | input | checks beyond "no panic" |
//! |---|---|---|
//! | [`wire_commands`] | a sequence of gRPC request messages (protobuf), converted as the `View` service converts them, applied to a small view | the view's invariants after every command; a second view fed the same commands through the raft log's codec reaches the same state hash; the final view survives a snapshot round trip over the wire |
//! | [`wire_snapshot`] | one `ViewSnapshot` or `ViewDelta` (protobuf) | a snapshot the validating conversion accepts gives a view whose invariants hold and that answers commands |
//! | [`spec_files`] | job specs (TOML and JSON bodies), cluster specs, topologies, speed models, synthetic-trace settings | an accepted job spec is valid and survives the wire and the log codec unchanged; an accepted cluster spec builds a clean view; an accepted topology survives the wire |
//! | [`trace_csv`] | the Philly, Alibaba pod and Alibaba node CSV loaders | a loaded trace's jobs are usable (finite, ordered, at least one GPU); a node list's cluster builds a clean view |
//! | [`raft_messages`] | a replica of a 3-replica group stepping arbitrary raft messages (raw protobuf or built field by field) between ticks, elections and proposals | the replica never panics; while it runs its view's invariants hold |

use std::io::Cursor;
use tessera_proto::prost::Message as _;
use tessera_proto::{v1, validate};
use tessera_replica::{MemBackend, Replica, ReplicaConfig, codec};
use tessera_view::{
    ClusterSpec, ClusterView, Command, Health, JobId, JobSpec, Preemption, Proposal, ProposalId, RequestId, ServerId,
    TaskEvent, Topology, invariants,
};
use tessera_view_server::service::{MAX_TASK_MESSAGE, cordon_command, layout_command, policy_command};

/// Most commands or messages one input drives: bounds an input's run time.
const MAX_STEPS: usize = 64;

/// Reads an input front to back; past its end every read gives zeros.
#[derive(Debug)]
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// A reader of `data`.
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data }
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |v, i| v | u64::from(self.u8()) << (8 * i))
    }

    /// The next chunk: a u16 length, then that many bytes (fewer at the end).
    pub fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16()).min(self.data.len());
        let (c, rest) = self.data.split_at(n);
        self.data = rest;
        c
    }
}

/// Writes inputs in the format [`Bytes`] reads: the seed corpus is made with it.
#[derive(Debug, Default)]
pub struct InputBuilder {
    out: Vec<u8>,
}

impl InputBuilder {
    /// A byte.
    pub fn u8(mut self, b: u8) -> Self {
        self.out.push(b);
        self
    }

    /// A little-endian u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A chunk (u16 length, then the bytes).
    pub fn chunk(mut self, c: &[u8]) -> Self {
        let n = u16::try_from(c.len()).expect("a chunk of at most 64 KiB");
        self.out.extend_from_slice(&n.to_le_bytes());
        self.out.extend_from_slice(c);
        self
    }

    /// The input.
    pub fn build(self) -> Vec<u8> {
        self.out
    }
}

/// The cluster the wire and raft targets run against: 4 servers of 8 GPUs in 2 racks, a short
/// change log and few ended jobs kept, so truncation paths run too.
pub fn small_view() -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("the seed-8gpu preset");
    ClusterView::from_spec(&ClusterSpec::uniform(topo, 4, 2, 1)).with_limits(32, 8)
}

fn assert_clean(view: &ClusterView, after: &str) {
    let report = invariants::check(view);
    assert!(report.is_clean(), "invariants broken after {after}: {report:?}");
}

/// The commands the `View` service makes of one request, or none when it refuses the request
/// (the conversion's error is the service's `INVALID_ARGUMENT`).
fn request_commands(kind: u8, body: &[u8]) -> Vec<Command> {
    fn decode<M: tessera_proto::prost::Message + Default>(b: &[u8]) -> Option<M> {
        M::decode(b).ok()
    }
    let proposals = |ps: Vec<v1::Proposal>| -> Option<Vec<Proposal>> {
        ps.into_iter().take(1024).map(|p| Proposal::try_from(p).ok()).collect()
    };
    match kind % 12 {
        0 => {
            let Some(r) = decode::<v1::SubmitJobRequest>(body) else { return vec![] };
            let request = if r.request_id.is_empty() {
                None
            } else {
                match RequestId::new(r.request_id) {
                    Ok(id) => Some(id),
                    Err(_) => return vec![],
                }
            };
            let mut cmds = Vec::new();
            for (i, s) in r.specs.into_iter().take(1024).enumerate() {
                let Ok(spec) = JobSpec::try_from(s) else { return vec![] };
                let request = match &request {
                    Some(id) => match id.item(i) {
                        Ok(item) => Some(item),
                        Err(_) => return vec![],
                    },
                    None => None,
                };
                // The leader admits every job under a trace (its own, or the caller's).
                let trace = tessera_view::JobTrace::new(i as u128 + 1, body.len() as u64 + 1);
                cmds.push(Command::Submit { spec: Box::new(spec), request, user: None, trace });
            }
            cmds
        }
        1 => decode::<v1::ProposeRequest>(body)
            .and_then(|r| proposals(r.proposals))
            .map(|ps| vec![Command::Propose(ps)])
            .unwrap_or_default(),
        2 => decode::<v1::ProposeRequest>(body)
            .and_then(|r| proposals(r.proposals))
            .map(|ps| vec![Command::Migrate(ps)])
            .unwrap_or_default(),
        3 => decode::<v1::PreemptRequest>(body)
            .and_then(|r| r.preemption)
            .and_then(|p| Preemption::try_from(p).ok())
            .map(|p| vec![Command::Preempt(p)])
            .unwrap_or_default(),
        4 => decode::<v1::ReleaseRequest>(body)
            .map(|r| vec![Command::Release { job: JobId(r.job), failed: r.failed }])
            .unwrap_or_default(),
        5 => decode::<v1::CancelJobRequest>(body)
            .filter(|r| r.reason.len() <= MAX_TASK_MESSAGE)
            .map(|r| {
                let reason = (!r.reason.is_empty()).then_some(r.reason);
                vec![Command::Cancel { job: JobId(r.job), reason, grace_s: r.grace_s }]
            })
            .unwrap_or_default(),
        6 => {
            let Some(r) = decode::<v1::ReportTaskRequest>(body) else { return vec![] };
            let event = match r.event {
                Some(v1::report_task_request::Event::Started(_)) => TaskEvent::Started,
                Some(v1::report_task_request::Event::Exited(e)) if e.message.len() <= MAX_TASK_MESSAGE => {
                    TaskEvent::Exited { code: e.code, message: e.message }
                }
                _ => return vec![],
            };
            vec![Command::Task {
                job: JobId(r.job),
                proposal: ProposalId(r.proposal),
                member: r.member,
                server: ServerId(r.server),
                event,
            }]
        }
        // A heartbeat: the driver records the unhealthy devices and takes the server up.
        7 => decode::<v1::HeartbeatRequest>(body)
            .map(|r| {
                let server = ServerId(r.server);
                let mut cmds = vec![Command::SetHealth { server, health: Health::Up, at_ms: 0 }];
                if let Some(devices) = r.unhealthy {
                    cmds.push(Command::SetUnhealthyDevices { server, devices });
                }
                cmds
            })
            .unwrap_or_default(),
        // An operator's cordon, drain or uncordon, at a fixed time.
        8 => decode::<v1::CordonServerRequest>(body)
            .and_then(|r| cordon_command(&r, 1_700_000_000_000).ok())
            .map(|c| vec![c])
            .unwrap_or_default(),
        // An operator's layout change, at a fixed time.
        10 => decode::<v1::LayoutRequest>(body)
            .and_then(|r| layout_command(&r, 1_700_000_000_000).ok())
            .map(|c| vec![c])
            .unwrap_or_default(),
        // An admin's quota or priority class.
        11 => {
            decode::<v1::PolicyRequest>(body).and_then(|r| policy_command(&r).ok()).map(|c| vec![c]).unwrap_or_default()
        }
        // What the lease keeper, the drain deadline and the scheduler hosts propose without a
        // request of their own.
        _ => {
            let mut b = Bytes::new(body);
            let server = ServerId(u32::from(b.u8() % 6));
            let at_ms = u64::from(b.u8());
            match b.u8() % 4 {
                0 => vec![Command::SetHealth { server, health: Health::Down, at_ms }],
                1 => vec![Command::SetHealth { server, health: Health::Draining, at_ms }],
                2 => vec![Command::Evict { server, at_ms }],
                _ => vec![Command::SetServiceQueue { job: JobId(u64::from(b.u8())), queue: b.u8() }],
            }
        }
    }
}

/// Target `wire_commands`: `(kind, chunk)*`, each chunk a request message of the kind's type.
pub fn wire_commands(data: &[u8]) {
    wire_commands_view(data);
}

/// [`wire_commands`], returning the view the input built (the seeds' tests read it).
pub fn wire_commands_view(data: &[u8]) -> ClusterView {
    let mut input = Bytes::new(data);
    let mut view = small_view();
    let mut follower = small_view();
    for step in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        let kind = input.u8();
        let cmds = request_commands(kind, input.chunk());
        if cmds.is_empty() {
            continue;
        }
        for cmd in &cmds {
            view.apply(cmd);
            assert_clean(&view, &format!("command {step}: {cmd:?}"));
        }
        // What a follower applies: the same commands through the log's encoding.
        let entry = codec::encode_commands(&cmds).expect("a converted command encodes");
        for cmd in codec::decode_commands(&entry).expect("an encoded entry decodes") {
            follower.apply(&cmd);
        }
        assert_eq!(view.state_hash(), follower.state_hash(), "a follower diverged at command {step}: {cmds:?}");
    }
    // The final view over the wire, as a snapshot reader gets it.
    let wire = v1::ViewSnapshot::from(&view.snapshot()).encode_to_vec();
    let decoded = v1::ViewSnapshot::decode(wire.as_slice()).expect("our own snapshot decodes");
    let snap = tessera_view::ViewSnapshot::try_from(decoded).expect("our own snapshot validates");
    let restored = ClusterView::from_snapshot(snap);
    assert_eq!(restored.state_hash(), view.state_hash(), "the snapshot round trip changed the view");
    if let Some(delta) = view.delta_since(tessera_view::ViewVersion(0)) {
        let wire = v1::ViewDelta::from(&delta);
        tessera_view::ViewDelta::try_from(wire).expect("our own delta validates");
    }
    view
}

/// Target `wire_snapshot`: the first byte picks a snapshot or a delta, the rest is the message.
pub fn wire_snapshot(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else { return };
    if kind % 2 == 1 {
        if let Ok(w) = v1::ViewDelta::decode(body) {
            let _ = tessera_view::ViewDelta::try_from(w);
        }
        return;
    }
    let Ok(w) = v1::ViewSnapshot::decode(body) else { return };
    let Ok(snap) = tessera_view::ViewSnapshot::try_from(w) else { return };
    validate::check_snapshot(&snap).expect("the conversion checked it");
    let mut view = ClusterView::from_snapshot(snap);
    assert_clean(&view, "restoring the snapshot");
    let hash = view.state_hash();
    let again = ClusterView::from_snapshot(view.snapshot());
    assert_eq!(again.state_hash(), hash, "snapshot of a restored view differs");
    // The restored view answers every kind of command without breaking.
    let jobs: Vec<JobId> = view.jobs().iter().map(|j| j.id).take(4).collect();
    for job in jobs {
        view.apply(&Command::Cancel { job, reason: None, grace_s: None });
        assert_clean(&view, "a cancel");
    }
    for s in 0..view.servers().len().min(4) {
        let server = ServerId(s as u32);
        view.apply(&Command::SetHealth { server, health: Health::Down, at_ms: 0 });
        view.apply(&Command::SetHealth { server, health: Health::Up, at_ms: 0 });
        assert_clean(&view, "a health change");
    }
}

/// Target `spec_files`: the first byte picks the parser, the rest is the file (UTF-8).
pub fn spec_files(data: &[u8]) {
    use tessera_view_server::http::{BodyFormat, parse_spec};
    let Some((&kind, body)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(body) else {
        // The HTTP parser takes bytes; the others only ever see UTF-8.
        let _ = parse_spec(body, BodyFormat::Json);
        return;
    };
    match kind % 7 {
        0 => {
            if let Ok(spec) = JobSpec::from_toml("fuzz.toml", text) {
                check_job_spec(&spec);
            }
        }
        1 | 2 => {
            let format = if kind % 7 == 1 { BodyFormat::Json } else { BodyFormat::Toml };
            if let Ok(spec) = parse_spec(body, format) {
                check_job_spec(&spec);
            }
        }
        3 => {
            if let Ok(spec) = ClusterSpec::from_toml("fuzz.toml", text, None) {
                let view = ClusterView::from_spec(&spec);
                assert_clean(&view, "building the cluster");
            }
        }
        4 => {
            if let Ok(t) = Topology::from_toml("fuzz.toml", text) {
                validate::check_topology(&t).expect("a parsed topology is valid on the wire");
                let back = Topology::try_from(v1::Topology::from(&t)).expect("a parsed topology converts back");
                assert_eq!(back, t, "the wire changed a topology");
            }
        }
        5 => {
            let _ = tessera_scheduler::sim::SpeedModel::from_toml("fuzz.toml", text);
        }
        _ => {
            let _ = tessera_scheduler::sim::synthetic::SyntheticSpec::parse(text);
        }
    }
}

fn check_job_spec(spec: &JobSpec) {
    spec.validate().expect("a parsed job spec is valid");
    validate::check_job_spec(spec).expect("a parsed job spec is valid on the wire");
    let back = JobSpec::try_from(v1::JobSpec::from(spec)).expect("a parsed job spec converts back");
    assert_eq!(&back, spec, "the wire changed a job spec");
    let entry = codec::encode_commands(&[Command::submit(spec.clone())]).expect("a job spec encodes in the log");
    let cmds = codec::decode_commands(&entry).expect("the log entry decodes");
    assert_eq!(cmds, vec![Command::submit(spec.clone())], "the log codec changed a job spec");
}

/// Target `trace_csv`: the first byte picks the loader, the rest is the CSV file.
pub fn trace_csv(data: &[u8]) {
    use tessera_scheduler::sim::trace_loader::{read_alibaba_nodes, read_alibaba_pods, read_philly};
    let Some((&kind, body)) = data.split_first() else { return };
    let input = Cursor::new(body.to_vec());
    let trace = match kind % 4 {
        0 => read_philly("fuzz.csv", input, None),
        1 => read_philly("fuzz.csv", input, Some("vc1")),
        2 => read_alibaba_pods("fuzz.csv", input),
        _ => {
            if let Ok(c) = read_alibaba_nodes("fuzz.csv", input) {
                let view = ClusterView::from_spec(&c.spec);
                assert_clean(&view, "building the node list's cluster");
            }
            return;
        }
    };
    let Ok(t) = trace else { return };
    assert!(!t.jobs.is_empty(), "a loaded trace has jobs");
    for w in t.jobs.windows(2) {
        assert!(w[0].arrival_s <= w[1].arrival_s, "jobs out of arrival order");
    }
    for j in &t.jobs {
        assert!(j.gpus >= 1, "a job without GPUs: {j:?}");
        assert!(j.arrival_s.is_finite() && j.arrival_s >= 0.0, "a bad arrival: {j:?}");
        assert!(j.duration_s.is_finite() && j.duration_s >= 1.0, "a bad duration: {j:?}");
        if let Some(c) = j.cores_per_gpu {
            assert!(c.is_finite() && c > 0.0, "bad cores per GPU: {j:?}");
        }
    }
}

/// A valid job of `gpus` GPUs, for proposals in the raft target.
fn small_job(gpus: u32) -> JobSpec {
    let text = format!("name = \"fuzz\"\ntenant = \"t\"\ngpus = {gpus}\n");
    JobSpec::from_toml("fuzz.toml", &text).expect("a valid job")
}

fn raft_message(b: &mut Bytes<'_>) -> raft::eraftpb::Message {
    use protobuf::ProtobufEnum as _;
    use raft::eraftpb::{Entry, EntryType, Message, MessageType, Snapshot};
    let mut m = Message::default();
    let kind = b.u8() % 19;
    m.set_msg_type(MessageType::from_i32(i32::from(kind)).unwrap_or(MessageType::MsgHup));
    m.from = u64::from(b.u8() % 5);
    m.to = 1;
    m.term = u64::from(b.u8() % 8);
    m.log_term = u64::from(b.u8() % 8);
    m.index = u64::from(b.u8() % 16);
    m.commit = u64::from(b.u8() % 16);
    m.commit_term = u64::from(b.u8() % 8);
    m.reject = b.u8() % 2 == 1;
    m.reject_hint = u64::from(b.u8() % 16);
    m.request_snapshot = u64::from(b.u8() % 16);
    let entries = b.u8() % 5;
    for _ in 0..entries {
        let mut e = Entry::default();
        e.set_entry_type(match b.u8() % 3 {
            0 => EntryType::EntryNormal,
            1 => EntryType::EntryConfChange,
            _ => EntryType::EntryConfChangeV2,
        });
        e.index = u64::from(b.u8() % 16);
        e.term = u64::from(b.u8() % 8);
        e.data = match b.u8() % 3 {
            0 => codec::encode_commands(&[Command::submit(small_job(1 + u32::from(b.u8() % 8)))])
                .expect("encodes")
                .into(),
            1 => Vec::new().into(),
            _ => b.chunk().to_vec().into(),
        };
        e.context = b.chunk().to_vec().into();
        m.entries.push(e);
    }
    if b.u8().is_multiple_of(4) {
        let mut s = Snapshot::default();
        let meta = s.mut_metadata();
        meta.index = u64::from(b.u8() % 16);
        meta.term = u64::from(b.u8() % 8);
        meta.mut_conf_state().voters = (0..b.u8() % 4).map(|_| u64::from(b.u8() % 5)).collect();
        s.data = b.chunk().to_vec().into();
        m.set_snapshot(s);
    }
    m.context = b.chunk().to_vec().into();
    m
}

/// Target `raft_messages`: operations on replica 1 of {1, 2, 3}, each followed by handling
/// raft's ready state as the server's driver does. An error from the replica stops it (the
/// driver stops the process, state intact); the input ends there.
pub fn raft_messages(data: &[u8]) {
    raft_replica(data);
}

/// [`raft_messages`], returning the replica (`None` if it stopped with an error).
pub fn raft_replica(data: &[u8]) -> Option<Replica<MemBackend>> {
    use raft::eraftpb::{Message, MessageType};
    let cfg = ReplicaConfig { sync: false, ..ReplicaConfig::new(1, vec![1, 2, 3], "fuzz") };
    let Ok(mut r) = Replica::with_backend(cfg, MemBackend::new(), small_view) else { panic!("a fresh replica opens") };
    let mut input = Bytes::new(data);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        let op = input.u8() % 9;
        let result = match op {
            0 => r.campaign(),
            1 => {
                for _ in 0..=input.u8() % 16 {
                    r.tick();
                }
                Ok(())
            }
            2 => {
                // Undecodable bytes are refused before raft sees them.
                let _ = r.step_bytes(input.chunk());
                Ok(())
            }
            3 => {
                let m = raft_message(&mut input);
                r.step(m);
                Ok(())
            }
            4 => r.propose(Command::submit(small_job(1 + u32::from(input.u8() % 8)))).map(|_| ()),
            5 => {
                let add = input.u8().is_multiple_of(2);
                let id = u64::from(input.u8() % 6);
                r.propose_membership(add, id, "127.0.0.1:1").map(|_| ())
            }
            6 => {
                let to = u64::from(input.u8() % 5);
                if input.u8().is_multiple_of(2) {
                    r.report_unreachable(to);
                } else {
                    r.report_snapshot(to, input.u8().is_multiple_of(2));
                }
                Ok(())
            }
            // Votes from both peers at the replica's term: an election it wins.
            7 => {
                let _ = r.campaign();
                for kind in [MessageType::MsgRequestPreVoteResponse, MessageType::MsgRequestVoteResponse] {
                    for from in [2, 3] {
                        let mut m = Message::default();
                        m.set_msg_type(kind);
                        (m.from, m.to, m.term) =
                            (from, 1, r.term() + u64::from(kind == MessageType::MsgRequestPreVoteResponse));
                        r.step(m);
                    }
                    if r.on_ready().is_err() {
                        return None;
                    }
                }
                Ok(())
            }
            // A heartbeat from peer 2 at a newer term: the replica follows it.
            _ => {
                let mut m = Message::default();
                m.set_msg_type(MessageType::MsgHeartbeat);
                (m.from, m.to, m.term) = (2, 1, r.term() + 1);
                m.commit = r.applied_index();
                r.step(m);
                Ok(())
            }
        };
        if result.is_err() {
            continue;
        }
        if r.on_ready().is_err() {
            return None;
        }
        let _ = r.take_outcomes();
        assert_clean(r.view(), "a raft step");
    }
    Some(r)
}

/// A fuzz target's checks: they return, whatever the bytes, or panic on a finding.
pub type Target = fn(&[u8]);

/// The fuzz targets, by name, with their functions.
pub const TARGETS: [(&str, Target); 5] = [
    ("wire_commands", wire_commands),
    ("wire_snapshot", wire_snapshot),
    ("spec_files", spec_files),
    ("trace_csv", trace_csv),
    ("raft_messages", raft_messages),
];

/// A placement of job `job` on the view as a scheduler would propose it.
fn placed(view: &ClusterView, job: JobId, id: u64) -> Proposal {
    use tessera_scheduler::{LocalView, Overlay, find_placement};
    use tessera_view::LocalityLevel;
    use tessera_view::fit::FitMode;
    let spec = &view.job(job).expect("the seed's job").spec;
    let found =
        find_placement(&LocalView::of_view(view), &Overlay::default(), spec, LocalityLevel::Any, FitMode::Pack, 0)
            .expect("the seed's job fits");
    Proposal { id: ProposalId(id), job, members: found.members, based_on: view.version() }
}

/// Well-formed inputs that reach deep into each target, written to `fuzz/corpus/` to start
/// the fuzzer from (`fuzz/run.sh --seeds`) and replayed by the tests. `root` is the repository
/// (job, cluster and topology files are read from it).
pub fn seeds(root: &std::path::Path) -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let req = |kind: u8, m: &dyn Fn() -> Vec<u8>| (kind, m());
    let submit = |name: &str, gpus: u32, request: &str| {
        let spec = small_job(gpus);
        let spec = JobSpec { name: name.to_string(), ..spec };
        v1::SubmitJobRequest { specs: vec![v1::JobSpec::from(&spec)], request_id: request.to_string() }.encode_to_vec()
    };
    let encode =
        |msgs: &[(u8, Vec<u8>)]| msgs.iter().fold(InputBuilder::default(), |b, (k, m)| b.u8(*k).chunk(m)).build();

    // A job's whole life: submitted, placed, started, exited, released; then one cancelled.
    let mut v = small_view();
    let mut life = vec![req(0, &|| submit("seed-a", 2, "seed-1"))];
    let mut follow = Vec::new();
    for (k, m) in &life {
        follow.extend(request_commands(*k, m));
    }
    for c in &follow {
        v.apply(c);
    }
    let p = placed(&v, JobId(1), 1);
    let server = p.members[0].server.0;
    v.apply(&Command::Propose(vec![p.clone()]));
    life.push((
        1,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    let task =
        |event| v1::ReportTaskRequest { job: 1, proposal: 1, member: 0, server, event: Some(event) }.encode_to_vec();
    life.push((6, task(v1::report_task_request::Event::Started(v1::TaskStarted::default()))));
    life.push((6, task(v1::report_task_request::Event::Exited(v1::TaskExited { code: 0, message: "done".into() }))));
    life.push((4, v1::ReleaseRequest { job: 1, failed: false }.encode_to_vec()));
    life.push((0, submit("seed-b", 4, "")));
    life.push((5, v1::CancelJobRequest { job: 2, reason: "seed".into(), grace_s: Some(30) }.encode_to_vec()));
    out.push(("wire_commands", "life".to_string(), encode(&life)));

    // Placed jobs moved, preempted, and caught by health changes.
    let mut v = small_view();
    let mut moves = vec![(0, submit("seed-c", 8, "seed-2")), (0, submit("seed-d", 4, ""))];
    for (k, m) in &moves {
        for c in request_commands(*k, m) {
            v.apply(&c);
        }
    }
    let p = placed(&v, JobId(1), 7);
    v.apply(&Command::Propose(vec![p.clone()]));
    moves.push((
        1,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    let q = placed(&v, JobId(2), 8);
    v.apply(&Command::Propose(vec![q.clone()]));
    moves.push((
        1,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&q)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    let m = Proposal { id: ProposalId(9), ..placed(&v, JobId(2), 9) };
    moves.push((
        2,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&m)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    let pre = Preemption {
        proposal: Proposal { id: ProposalId(10), ..p.clone() },
        victims: vec![JobId(1)],
        reason: "seed".into(),
    };
    moves.push((3, v1::PreemptRequest { preemption: Some(v1::Preemption::from(&pre)) }.encode_to_vec()));
    let heartbeat = v1::HeartbeatRequest { server: p.members[0].server.0, unhealthy: Some(1), ..Default::default() };
    moves.push((7, heartbeat.encode_to_vec()));
    let drain = v1::CordonServerRequest {
        server: q.members[0].server.0,
        action: v1::CordonAction::Drain.into(),
        reason: "seed: maintenance".into(),
        drain_timeout_s: 60,
    };
    moves.push((8, drain.encode_to_vec()));
    moves.push((9, vec![q.members[0].server.0 as u8, 7, 2]));
    let uncordon = v1::CordonServerRequest { action: v1::CordonAction::Uncordon.into(), ..drain };
    moves.push((8, uncordon.encode_to_vec()));
    moves.push((9, vec![p.members[0].server.0 as u8, 9, 0]));
    moves.push((9, vec![1, 2, 3, 2, 3]));
    out.push(("wire_commands", "moves".to_string(), encode(&moves)));

    // The layout changed under a running cluster: a configuration set and two servers added,
    // one brought up by its agent's heartbeat, a job placed there, the other removed; and a
    // snapshot of the result (tombstone and all).
    let layout = |change| (10u8, v1::LayoutRequest { change: Some(change) }.encode_to_vec());
    let topology = Topology::preset("pcie-4gpu").expect("a compiled-in preset");
    let mut grow = vec![
        layout(v1::layout_request::Change::AddConfigSet(v1::AddConfigSet {
            rack: "rack-new".into(),
            ib_domain: "ib-new".into(),
            topology: Some(v1::Topology::from(&topology)),
        })),
        (0, submit("seed-e", 1, "")),
    ];
    let mut v = small_view();
    for (k, m) in &grow {
        for c in request_commands(*k, m) {
            v.apply(&c);
        }
    }
    let cs = (v.config_sets().len() - 1) as u32;
    let first = v.servers().len() as u32;
    grow.push(layout(v1::layout_request::Change::AddServers(v1::AddServers {
        config_set: cs,
        names: vec!["new-0".into(), "new-1".into()],
    })));
    grow.push((7, v1::HeartbeatRequest { server: first, ..Default::default() }.encode_to_vec()));
    grow.push(layout(v1::layout_request::Change::RemoveServer(v1::RemoveServer { server: first + 1 })));
    for (k, m) in &grow[2..] {
        for c in request_commands(*k, m) {
            v.apply(&c);
        }
    }
    let spec = v.job(JobId(1)).map(|j| j.spec.clone()).expect("the seed's job");
    let req = tessera_view::fit::member_request(&spec, &topology);
    let member = tessera_view::MemberPlacement {
        server: ServerId(first),
        gpus: 1,
        cores: tessera_view::CoreMask::range(0, req.want_cores),
        memory_mib: req.memory_mib,
    };
    let p = Proposal { id: ProposalId(1), job: JobId(1), members: vec![member], based_on: v.version() };
    v.apply(&Command::Propose(vec![p.clone()]));
    grow.push((
        1,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    out.push(("wire_commands", "layout".to_string(), encode(&grow)));
    let mut snap = vec![0];
    snap.extend(v1::ViewSnapshot::from(&v.snapshot()).encode_to_vec());
    out.push(("wire_snapshot", "layout".to_string(), snap));

    // An admin's policy on a running cluster: a quota set, a job placed under it, the quota
    // lowered below what the tenant holds (it keeps its gang) and removed, a class added and
    // a job naming it admitted, the class removed; malformed names refused on the way.
    let policy = |change| (11u8, v1::PolicyRequest { change: Some(change) }.encode_to_vec());
    let quota =
        |gpus| policy(v1::policy_request::Change::Quota(v1::SetQuota { tenant: "t".into(), gpus, class: None }));
    let class_quota = |class: &str, gpus| {
        let q = v1::SetQuota { tenant: "t".into(), gpus, class: Some(class.into()) };
        policy(v1::policy_request::Change::Quota(q))
    };
    let class = |name: &str, priority| {
        policy(v1::policy_request::Change::PriorityClass(v1::SetPriorityClass { class: name.into(), priority }))
    };
    let mut rules = vec![quota(Some(4)), (0, submit("seed-f", 2, "")), (0, submit("seed-g", 8, ""))];
    let mut v = small_view();
    for (k, m) in &rules {
        for c in request_commands(*k, m) {
            v.apply(&c);
        }
    }
    let p = placed(&v, JobId(1), 11);
    v.apply(&Command::Propose(vec![p.clone()]));
    rules.push((
        1,
        v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() }
            .encode_to_vec(),
    ));
    rules.push(class_quota("batch", Some(2)));
    rules.push(class_quota("no-such-class", Some(2)));
    rules.push(class("urgent", Some(500)));
    let urgent = JobSpec { class: Some("urgent".into()), ..small_job(1) };
    let urgent = v1::SubmitJobRequest { specs: vec![v1::JobSpec::from(&urgent)], request_id: String::new() };
    rules.push((0, urgent.encode_to_vec()));
    rules.push(quota(Some(1)));
    rules.push(class("two words", Some(1)));
    rules.push(class("urgent", None));
    rules.push(class_quota("batch", None));
    rules.push(quota(None));
    // A credential revoked (the view's clock is 0 in this seed, so any expiry is later), the
    // same again, a malformed fingerprint, one without an expiry, and the first taken off.
    let revoke = |fingerprint: &str, not_after_ms| {
        let entry = v1::Revocation {
            fingerprint: String::new(),
            subject: "user/alice".into(),
            not_after_ms,
            note: "leaked".into(),
            at_ms: 0,
        };
        let r = v1::SetRevocation { fingerprint: fingerprint.into(), revocation: Some(entry) };
        policy(v1::policy_request::Change::Revocation(r))
    };
    let fp = format!("sha256:{}", "0f".repeat(32));
    rules.push(revoke(&fp, 1_000));
    rules.push(revoke(&fp, 1_000));
    rules.push(revoke("sha256:0F", 1_000));
    rules.push(revoke(&format!("sha256:{}", "1e".repeat(32)), 0));
    rules.push(policy(v1::policy_request::Change::Revocation(v1::SetRevocation { fingerprint: fp, revocation: None })));
    out.push(("wire_commands", "policy".to_string(), encode(&rules)));

    // The views those build, as a snapshot and a delta.
    let mut v = small_view();
    for (k, m) in &life[..2] {
        for c in request_commands(*k, m) {
            v.apply(&c);
        }
    }
    let mut snap = vec![0];
    snap.extend(v1::ViewSnapshot::from(&v.snapshot()).encode_to_vec());
    out.push(("wire_snapshot", "placed".to_string(), snap));
    if let Some(d) = v.delta_since(tessera_view::ViewVersion(0)) {
        let mut delta = vec![1];
        delta.extend(v1::ViewDelta::from(&d).encode_to_vec());
        out.push(("wire_snapshot", "delta".to_string(), delta));
    }

    // The project's own files, each under the parser that reads it.
    let files: [(u8, &str); 5] =
        [(0, "examples/jobs"), (0, "deploy/jobs"), (3, "deploy/clusters"), (4, "deploy/topologies"), (5, "deploy/sim")];
    for (kind, dir) in files {
        let Ok(list) = std::fs::read_dir(root.join(dir)) else { continue };
        let mut paths: Vec<_> = list.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
            let Ok(text) = std::fs::read(&path) else { continue };
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let mut input = vec![kind];
            input.extend(&text);
            if kind == 0 {
                // The same job as an HTTP body, TOML and JSON.
                let mut toml = vec![2];
                toml.extend(&text);
                out.push(("spec_files", format!("http-{name}"), toml));
                if let Ok(value) = toml::from_str::<serde_json::Value>(&String::from_utf8_lossy(&text)) {
                    let mut json = vec![1];
                    json.extend(serde_json::to_vec(&value).unwrap_or_default());
                    out.push(("spec_files", format!("json-{name}"), json));
                }
            }
            out.push(("spec_files", format!("{dir}-{name}").replace('/', "-"), input));
        }
    }
    out.push(("spec_files", "synthetic".to_string(), b"\x06jobs=50,gpus=1:0.5|8:0.5,load=0.9".to_vec()));

    // One small file per trace format.
    let csvs: [(u8, &str, &str); 3] = [
        (
            0,
            "philly",
            "job_id,vc,submit_time_s,num_gpus,duration_s_v100,job_type\n0,vc1,0,1,10,LM\n1,vc2,5,8,nan,CV\n2,vc1,9,2,100,LM\n",
        ),
        (
            2,
            "alibaba-pods",
            "job_id,submit_time_s,num_gpus,gpu_milli,duration_s,cpu_milli,memory_mib,gpu_spec\na,0,1,1000,100,12000,16384,\nb,5,1,460,50,6000,12288,T4\nc,6,0,0,50,6000,12288,\n",
        ),
        (
            3,
            "alibaba-nodes",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\nn1,8000,32768,1,V100M16\nn2,8000,32768,0,CPU\n",
        ),
    ];
    for (kind, name, text) in csvs {
        let mut input = vec![kind];
        input.extend(text.as_bytes());
        out.push(("trace_csv", name.to_string(), input));
    }

    // A replica that leads and takes proposals; one that follows and is sent entries.
    let lead = InputBuilder::default().u8(7).u8(4).u8(1).u8(4).u8(3).u8(1).u8(0).u8(5).u8(0).u8(4).build();
    out.push(("raft_messages", "lead".to_string(), lead));
    let follow = InputBuilder::default()
        // Follow replica 2 at the next term (2: the bootstrap snapshot is at index 1, term 1).
        .u8(8)
        // A structured message (3): MsgAppend (3) from 2, term 2, after index 1 of term 1,
        // committing 2; not a reject; no hints.
        .u8(3)
        .u8(3)
        .u8(2)
        .u8(2)
        .u8(1)
        .u8(1)
        .u8(2)
        .u8(0)
        .u8(0)
        .u8(0)
        .u8(0)
        // One normal entry (0) at index 2, term 2, holding a submission of a 2-GPU job.
        .u8(1)
        .u8(0)
        .u8(2)
        .u8(2)
        .u8(0)
        .u8(1)
        .chunk(&[])
        // No snapshot, no context; then a tick.
        .u8(1)
        .chunk(&[])
        .u8(1)
        .u8(0)
        .build();
    out.push(("raft_messages", "follow".to_string(), follow));
    out
}
