//! [`LocalView`]: a scheduler's copy of the cluster view with a free-capacity index.
//!
//! The index groups `Up` servers into buckets keyed by their topology and a capacity key:
//! the most free devices in any PCIe-level group, in any socket, and in the whole server. A
//! search for "g GPUs within one socket" then visits only buckets whose socket figure is at
//! least g, instead of every server. Buckets are few (tens per topology) because the key
//! saturates at the topology's group sizes. Each server update moves it between buckets in
//! O(1) (swap-remove).
//!
//! Per configuration set a histogram counts up servers by free-device count, so a search for a
//! multi-server gang can count member slots per rack without visiting servers.

use crate::error::SchedulerError;
use std::collections::{BTreeMap, HashMap};
use tessera_view::{
    ClusterView, ConfigSet, ConfigSetId, Health, LocalityLevel, ServerId, ServerRecord, Topology, ViewDelta,
    ViewSnapshot, ViewVersion,
};

/// Not in any bucket (server not up).
const NO_POS: u32 = u32::MAX;

/// One bucket of the free-capacity index.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub(crate) topology: u16,
    pub(crate) key: u32,
    pub(crate) servers: Vec<ServerId>,
}

/// The capacity key of a record: `pcie << 16 | socket << 8 | total` free devices.
#[inline]
pub(crate) fn capacity_key(topo: &Topology, free: u64) -> u32 {
    let mut pcie = 0;
    for &g in topo.pcie_switches.iter().chain(topo.nvlink_groups.iter()) {
        pcie = pcie.max((free & g).count_ones());
    }
    let mut socket = 0;
    for &g in &topo.sockets {
        socket = socket.max((free & g).count_ones());
    }
    pcie << 16 | socket << 8 | free.count_ones()
}

/// The free-device figure of `key` at an intra-server level.
#[inline]
pub(crate) fn key_at(key: u32, level: LocalityLevel) -> u32 {
    match level {
        LocalityLevel::PcieSwitch => key >> 16,
        LocalityLevel::Socket => (key >> 8) & 0xff,
        _ => key & 0xff,
    }
}

/// Fresher records a scheduler learned (from rejections) than its view holds.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    entries: HashMap<ServerId, ServerRecord>,
}

impl Overlay {
    /// Records fresher state for servers.
    pub fn learn(&mut self, fresh: &[(ServerId, ServerRecord)]) {
        self.entries.extend(fresh.iter().copied());
    }

    /// The fresher record of `s`, if known.
    #[inline]
    pub fn get(&self, s: ServerId) -> Option<&ServerRecord> {
        if self.entries.is_empty() {
            return None;
        }
        self.entries.get(&s)
    }

    /// Forgets everything (after the view caught up).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Number of servers known fresher.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A scheduler's copy of the view.
#[derive(Debug, Clone)]
pub struct LocalView {
    version: ViewVersion,
    topologies: Vec<Topology>,
    config_sets: Vec<ConfigSet>,
    rack_count: usize,
    ib_count: usize,
    servers: Vec<ServerRecord>,
    /// Unhealthy devices of the servers that have any (bit i = device i): a released device
    /// stays taken when it is here, which is what a search that gives running jobs' devices back
    /// must know ([`crate::preemption`]). Sparse: most servers have none, and the copy's cost
    /// per server stays the record and its index entries.
    unhealthy: BTreeMap<ServerId, u64>,
    // Index.
    key: Vec<u32>,
    pos: Vec<u32>,
    pub(crate) buckets: Vec<Bucket>,
    bucket_of: HashMap<(u16, u32), u32>,
    pub(crate) topology_buckets: Vec<Vec<u32>>,
    // Per configuration set: servers, histogram of up servers by free devices.
    pub(crate) cs_servers: Vec<Vec<ServerId>>,
    pub(crate) cs_hist: Vec<Vec<u32>>,
    // Per rack / IB domain: configuration sets.
    pub(crate) rack_sets: Vec<Vec<ConfigSetId>>,
    pub(crate) ib_racks: Vec<Vec<u32>>,
    // Load, per topology: (total devices of up servers, free devices of up servers).
    load: Vec<(u64, u64)>,
    // Per topology: (up servers, up servers with every device free).
    whole: Vec<(u64, u64)>,
}

impl LocalView {
    /// A copy of a snapshot, indexed.
    pub fn from_snapshot(s: &ViewSnapshot) -> LocalView {
        LocalView::build(s.version, &s.topologies, &s.config_sets, s.racks.len(), s.ib_domains.len(), &s.servers)
            .with_unhealthy(|i| s.unhealthy.get(i).copied().unwrap_or(0))
    }

    /// A copy of a view (same as taking a snapshot, without copying jobs).
    pub fn of_view(v: &ClusterView) -> LocalView {
        LocalView::build(
            v.version(),
            v.topologies(),
            v.config_sets(),
            v.racks().len(),
            v.ib_domains().len(),
            v.servers(),
        )
        .with_unhealthy(|i| v.unhealthy_devices(ServerId(i as u32)))
    }

    /// This copy with each server's unhealthy devices from `of(index)`.
    fn with_unhealthy(mut self, of: impl Fn(usize) -> u64) -> LocalView {
        for i in 0..self.servers.len() {
            self.set_unhealthy(ServerId(i as u32), of(i));
        }
        self
    }

    /// Records server `s`'s unhealthy devices (a known server's only).
    fn set_unhealthy(&mut self, s: ServerId, devices: u64) {
        if devices == 0 {
            self.unhealthy.remove(&s);
        } else if s.index() < self.servers.len() {
            self.unhealthy.insert(s, devices);
        }
    }

    fn build(
        version: ViewVersion,
        topologies: &[Topology],
        config_sets: &[ConfigSet],
        racks: usize,
        ibs: usize,
        servers: &[ServerRecord],
    ) -> LocalView {
        let mut v = LocalView {
            version,
            topologies: topologies.to_vec(),
            config_sets: config_sets.to_vec(),
            rack_count: racks,
            ib_count: ibs,
            servers: servers.to_vec(),
            unhealthy: BTreeMap::new(),
            key: vec![0; servers.len()],
            pos: vec![NO_POS; servers.len()],
            buckets: Vec::new(),
            bucket_of: HashMap::new(),
            topology_buckets: vec![Vec::new(); topologies.len()],
            cs_servers: vec![Vec::new(); config_sets.len()],
            cs_hist: config_sets
                .iter()
                .map(|cs| vec![0; topologies[cs.topology as usize].devices as usize + 1])
                .collect(),
            rack_sets: vec![Vec::new(); racks],
            ib_racks: vec![Vec::new(); ibs],
            load: vec![(0, 0); topologies.len()],
            whole: vec![(0, 0); topologies.len()],
        };
        for cs in config_sets {
            v.rack_sets[cs.rack as usize].push(cs.id);
            if !v.ib_racks[cs.ib_domain as usize].contains(&cs.rack) {
                v.ib_racks[cs.ib_domain as usize].push(cs.rack);
            }
        }
        for i in 0..v.servers.len() {
            let s = ServerId(i as u32);
            v.cs_servers[v.servers[i].config_set.index()].push(s);
            v.insert(s);
        }
        v
    }

    /// The version this copy reflects.
    #[inline]
    pub fn version(&self) -> ViewVersion {
        self.version
    }

    /// Topologies.
    #[inline]
    pub fn topologies(&self) -> &[Topology] {
        &self.topologies
    }

    /// Configuration sets.
    #[inline]
    pub fn config_sets(&self) -> &[ConfigSet] {
        &self.config_sets
    }

    /// Server records.
    #[inline]
    pub fn servers(&self) -> &[ServerRecord] {
        &self.servers
    }

    /// A server's unhealthy devices (bit i = device i; 0 for an unknown server): a job that
    /// releases one of them does not free it.
    #[inline]
    pub fn unhealthy_devices(&self, s: ServerId) -> u64 {
        self.unhealthy.get(&s).copied().unwrap_or(0)
    }

    /// Number of racks.
    pub fn rack_count(&self) -> usize {
        self.rack_count
    }

    /// Number of InfiniBand domains.
    pub fn ib_count(&self) -> usize {
        self.ib_count
    }

    /// The topology of a server's configuration set.
    #[inline]
    pub fn topology_of(&self, cs: ConfigSetId) -> &Topology {
        &self.topologies[self.config_sets[cs.index()].topology as usize]
    }

    /// Used fraction of the GPUs of up servers of the given device type (all types if `None`).
    pub fn utilization_of_type(&self, device_type: Option<&str>) -> f64 {
        let (total, free) = self.sum_by_type(device_type, &self.load);
        if total == 0 { 1.0 } else { 1.0 - free as f64 / total as f64 }
    }

    /// Fraction of up servers of the given device type (all if `None`) with every device free.
    pub fn whole_free_fraction(&self, device_type: Option<&str>) -> f64 {
        let (up, whole) = self.sum_by_type(device_type, &self.whole);
        if up == 0 { 0.0 } else { whole as f64 / up as f64 }
    }

    /// Sums per-topology counter pairs over the topologies of a device type.
    fn sum_by_type(&self, device_type: Option<&str>, per_topology: &[(u64, u64)]) -> (u64, u64) {
        self.topologies
            .iter()
            .zip(per_topology)
            .filter(|(t, _)| device_type.is_none_or(|d| d == t.device_type))
            .fold((0, 0), |(a, b), (_, &(x, y))| (a + x, b + y))
    }

    /// Replaces one server's record (from a delta, a rejection or a watch event). A record
    /// that cannot belong to that server (unknown server, another configuration set, devices,
    /// cores or memory beyond its topology) is refused and the copy left unchanged.
    pub fn apply_server(&mut self, s: ServerId, rec: ServerRecord) -> bool {
        if !self.fits(s, &rec) {
            return false;
        }
        if self.servers[s.index()] == rec {
            return true;
        }
        self.remove(s);
        self.servers[s.index()] = rec;
        self.insert(s);
        true
    }

    /// Whether `rec` can be server `s`'s record: a known server, its configuration set, and no
    /// device, core or memory beyond its topology.
    fn fits(&self, s: ServerId, rec: &ServerRecord) -> bool {
        self.servers.get(s.index()).is_some_and(|old| {
            let t = self.topology_of(old.config_set);
            rec.config_set == old.config_set
                && rec.free_gpus & !t.all_devices() == 0
                && rec.free_cores.is_subset_of(t.all_cores())
                && rec.free_memory_mib <= t.memory_mib
        })
    }

    /// Applies a delta; returns false (and changes nothing) unless it starts at or before this
    /// copy's version and ends at or after it (an older delta would roll records back), and
    /// every record, and every unhealthy-device mask it carries, fits its server.
    pub fn apply_delta(&mut self, d: &ViewDelta) -> bool {
        if d.from > self.version || d.to < self.version {
            return false;
        }
        if !d.servers.iter().all(|(s, r)| self.fits(*s, r)) {
            return false;
        }
        let masks_fit = d.unhealthy.is_empty()
            || (d.unhealthy.len() == d.servers.len()
                && d.servers.iter().zip(&d.unhealthy).all(|((_, r), &bad)| {
                    bad & !self.topology_of(r.config_set).all_devices() == 0 && bad & r.free_gpus == 0
                }));
        if !masks_fit {
            return false;
        }
        for (i, &(s, r)) in d.servers.iter().enumerate() {
            // A delta without masks (from a sender that carries none) leaves the masks held,
            // less the devices its records show free (healthy again: a sick one is never free).
            let bad = d.unhealthy.get(i).copied().unwrap_or(self.unhealthy_devices(s) & !r.free_gpus);
            self.set_unhealthy(s, bad);
            self.apply_server(s, r);
        }
        self.version = self.version.max(d.to);
        true
    }

    /// Brings this copy up to `view`'s version through its change log, or rebuilds it from the
    /// view when the log no longer reaches back. Returns the number of server updates.
    pub fn catch_up(&mut self, view: &ClusterView) -> usize {
        let mut updates: Vec<(ServerId, ServerRecord)> = Vec::new();
        if view.for_each_changed_server(self.version, |s, r| updates.push((s, *r))) {
            let n = updates.len();
            for (s, r) in updates {
                self.set_unhealthy(s, view.unhealthy_devices(s));
                self.apply_server(s, r);
            }
            self.version = view.version();
            n
        } else {
            *self = LocalView::of_view(view);
            self.servers.len()
        }
    }

    fn insert(&mut self, s: ServerId) {
        let rec = self.servers[s.index()];
        let cs = rec.config_set.index();
        let t = self.config_sets[cs].topology;
        let topo = &self.topologies[t as usize];
        if rec.health != Health::Up {
            self.pos[s.index()] = NO_POS;
            return;
        }
        let key = capacity_key(topo, rec.free_gpus);
        let free = rec.free_gpus.count_ones();
        self.load[t as usize].0 += topo.devices as u64;
        self.load[t as usize].1 += free as u64;
        self.whole[t as usize].0 += 1;
        self.whole[t as usize].1 += (free == topo.devices) as u64;
        self.cs_hist[cs][free as usize] += 1;
        let b = match self.bucket_of.get(&(t, key)) {
            Some(&b) => b,
            None => {
                let b = self.buckets.len() as u32;
                self.buckets.push(Bucket { topology: t, key, servers: Vec::new() });
                self.bucket_of.insert((t, key), b);
                self.topology_buckets[t as usize].push(b);
                b
            }
        };
        let bucket = &mut self.buckets[b as usize].servers;
        self.key[s.index()] = key;
        self.pos[s.index()] = bucket.len() as u32;
        bucket.push(s);
    }

    fn remove(&mut self, s: ServerId) {
        let p = self.pos[s.index()];
        if p == NO_POS {
            return;
        }
        let rec = self.servers[s.index()];
        let cs = rec.config_set.index();
        let t = self.config_sets[cs].topology;
        let devices = self.topologies[t as usize].devices as u64;
        let free = rec.free_gpus.count_ones();
        self.load[t as usize].0 -= devices;
        self.load[t as usize].1 -= free as u64;
        self.whole[t as usize].0 -= 1;
        self.whole[t as usize].1 -= (free as u64 == devices) as u64;
        self.cs_hist[cs][free as usize] -= 1;
        let b = self.bucket_of[&(t, self.key[s.index()])];
        let bucket = &mut self.buckets[b as usize].servers;
        bucket.swap_remove(p as usize);
        if let Some(&moved) = bucket.get(p as usize) {
            self.pos[moved.index()] = p;
        }
        self.pos[s.index()] = NO_POS;
    }

    /// Bytes this copy spends per server on the index (key, position and bucket entry),
    /// beyond the record itself.
    pub const INDEX_BYTES_PER_SERVER: usize = 4 + 4 + std::mem::size_of::<ServerId>();

    /// Checks the index against the records (for tests): every up server is in exactly the
    /// bucket its record implies, histograms and load match.
    pub fn check_index(&self) -> Result<(), SchedulerError> {
        let mut seen = vec![false; self.servers.len()];
        for b in &self.buckets {
            for (i, s) in b.servers.iter().enumerate() {
                let rec = &self.servers[s.index()];
                let topo = self.topology_of(rec.config_set);
                if rec.health != Health::Up {
                    return Err(SchedulerError::IndexedNotUp { server: *s, health: rec.health });
                }
                if capacity_key(topo, rec.free_gpus) != b.key || self.pos[s.index()] as usize != i {
                    return Err(SchedulerError::MisIndexed(*s));
                }
                if std::mem::replace(&mut seen[s.index()], true) {
                    return Err(SchedulerError::IndexedTwice(*s));
                }
            }
        }
        for (i, rec) in self.servers.iter().enumerate() {
            if rec.health == Health::Up && !seen[i] {
                return Err(SchedulerError::NotIndexed(ServerId(i as u32)));
            }
        }
        for (cs, hist) in self.cs_hist.iter().enumerate() {
            let mut want = vec![0u32; hist.len()];
            for s in &self.cs_servers[cs] {
                let r = &self.servers[s.index()];
                if r.health == Health::Up {
                    want[r.free_gpus.count_ones() as usize] += 1;
                }
            }
            if *hist != want {
                return Err(SchedulerError::HistogramOff(ConfigSetId(cs as u16)));
            }
        }
        Ok(())
    }
}
