//! Cluster spec files: which configuration sets exist, how many servers each has, where they sit.
//!
//! ```toml
//! name = "dev"
//! [[racks]]
//! name = "rack-a"
//! ib_domain = "ib-0"
//! topology = "seed-8gpu"         # a compiled-in preset, or
//! # topology_file = "my.toml"    # a file, relative to this spec file
//! servers = 2
//!
//! [quotas]                       # optional: most GPUs a tenant may hold at once
//! vision = 16
//!
//! [class_quotas]                 # optional: most GPUs a tenant may hold at a priority class
//! vision = { production = 8 }    # and above (see `policy`)
//!
//! [priorities]                   # optional; these are the defaults (see `priority`)
//! classes = { production = 100, batch = 50, best-effort = 0 }
//! max_preemptions = 3
//! attained_service_gpu_s = []    # attained-service queue thresholds (none: arrival order)
//!
//! [accounting]                   # optional; the defaults
//! retention_days = 92            # how long the usage ledger keeps hourly GPU/core time, and
//!                                # the replicas their history of jobs the view forgot
//! ended_jobs_kept = 100000       # ended jobs the view keeps (older ones: the history)
//! ```
//!
//! Each `[[racks]]` entry becomes one configuration set; several entries may share a rack name
//! (servers of different topologies in one rack) if they agree on its InfiniBand domain.

use crate::error::SpecError;
use crate::priority::Priorities;
use crate::topology::Topology;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The most servers one view holds.
pub const MAX_SERVERS: u64 = 1 << 24;
/// The most configuration sets (`[[racks]]` entries) one view holds: ids are 16 bits.
pub const MAX_CONFIG_SETS: usize = u16::MAX as usize;

/// One group of identical servers in one rack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RackGroup {
    /// Rack name.
    pub rack: String,
    /// InfiniBand domain name.
    pub ib_domain: String,
    /// Index into [`ClusterSpec::topologies`].
    pub topology: usize,
    /// Number of servers.
    pub servers: u32,
}

/// A validated cluster spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSpec {
    /// Cluster name.
    pub name: String,
    /// Distinct topologies used.
    pub topologies: Vec<Topology>,
    /// Server groups in file order.
    pub groups: Vec<RackGroup>,
    /// GPU quota per tenant; tenants not listed are unlimited.
    pub quotas: BTreeMap<String, u32>,
    /// GPU quota per tenant at a priority class and above: tenant → class → GPUs.
    pub class_quotas: BTreeMap<String, BTreeMap<String, u32>>,
    /// Priority classes and the preemption bound.
    pub priorities: Priorities,
    /// Accounting settings.
    pub accounting: Accounting,
}

/// Accounting settings of a cluster: the same on every replica, since the usage ledger they
/// bound is replicated state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accounting {
    /// How many days the usage ledger keeps (hourly buckets per tenant and user), and the
    /// replicas their history of ended jobs, 1 to 3,660.
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// How many ended jobs the view keeps, newest first, 1 to [`MAX_ENDED_JOBS_KEPT`]; older
    /// ones live on in each replica's history of ended jobs.
    #[serde(default = "default_ended_jobs_kept")]
    pub ended_jobs_kept: u32,
}

fn default_retention_days() -> u32 {
    crate::usage::DEFAULT_USAGE_RETENTION_HOURS / 24
}

fn default_ended_jobs_kept() -> u32 {
    crate::view::DEFAULT_ENDED_JOBS_KEPT as u32
}

/// The most ended jobs a view may keep.
pub const MAX_ENDED_JOBS_KEPT: u32 = 1_000_000;

impl Default for Accounting {
    fn default() -> Accounting {
        Accounting { retention_days: default_retention_days(), ended_jobs_kept: default_ended_jobs_kept() }
    }
}

/// The longest usage retention a cluster spec may ask for: ten years.
pub const MAX_RETENTION_DAYS: u32 = 3_660;

/// The file format, read by [`ClusterSpec::from_toml`] and written by [`ClusterSpec::write_files`].
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    racks: Vec<RawRack>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    quotas: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    class_quotas: BTreeMap<String, BTreeMap<String, u32>>,
    #[serde(default)]
    priorities: RawPriorities,
    #[serde(default)]
    accounting: Accounting,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPriorities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    classes: Option<BTreeMap<String, i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_preemptions: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attained_service_gpu_s: Vec<u64>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRack {
    name: String,
    ib_domain: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topology: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topology_file: Option<String>,
    servers: u32,
}

impl ClusterSpec {
    /// Parses and validates a cluster spec. `file` names it in errors; `dir` resolves
    /// `topology_file` paths (the spec file's directory).
    pub fn from_toml(file: &str, text: &str, dir: Option<&Path>) -> Result<ClusterSpec, SpecError> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| SpecError::syntax(file, &e))?;
        if raw.name.trim().is_empty() {
            return Err(SpecError::invalid(file, "name", "must not be empty"));
        }
        if raw.racks.is_empty() {
            return Err(SpecError::invalid(file, "racks", "at least one [[racks]] entry is required"));
        }
        let defaults = Priorities::default();
        let priorities = Priorities {
            classes: raw.priorities.classes.unwrap_or(defaults.classes),
            max_preemptions: raw.priorities.max_preemptions.unwrap_or(defaults.max_preemptions),
            attained_service_gpu_s: raw.priorities.attained_service_gpu_s,
        };
        if let Err((field, message)) = priorities.validate() {
            return Err(SpecError::invalid(file, format!("priorities.{field}"), message));
        }
        if !(1..=MAX_RETENTION_DAYS).contains(&raw.accounting.retention_days) {
            return Err(SpecError::invalid(
                file,
                "accounting.retention_days",
                format!("1 to {MAX_RETENTION_DAYS} days, got {}", raw.accounting.retention_days),
            ));
        }
        if !(1..=MAX_ENDED_JOBS_KEPT).contains(&raw.accounting.ended_jobs_kept) {
            return Err(SpecError::invalid(
                file,
                "accounting.ended_jobs_kept",
                format!("1 to {MAX_ENDED_JOBS_KEPT} jobs, got {}", raw.accounting.ended_jobs_kept),
            ));
        }
        let mut spec = ClusterSpec {
            name: raw.name,
            topologies: Vec::new(),
            groups: Vec::new(),
            quotas: raw.quotas,
            class_quotas: raw.class_quotas,
            priorities,
            accounting: raw.accounting,
        };
        let mut ib_of_rack: BTreeMap<String, String> = BTreeMap::new();
        let mut seen_groups: std::collections::HashSet<(String, usize)> = std::collections::HashSet::new();
        let mut total: u64 = 0;
        for (i, r) in raw.racks.iter().enumerate() {
            let f = |name: &str| format!("racks[{i}].{name}");
            if r.name.trim().is_empty() {
                return Err(SpecError::invalid(file, f("name"), "must not be empty"));
            }
            if r.ib_domain.trim().is_empty() {
                return Err(SpecError::invalid(file, f("ib_domain"), "must not be empty"));
            }
            if r.servers == 0 {
                return Err(SpecError::invalid(file, f("servers"), "must be at least 1"));
            }
            if i >= MAX_CONFIG_SETS {
                return Err(SpecError::invalid(file, "racks", format!("more than {MAX_CONFIG_SETS} entries")));
            }
            total += r.servers as u64;
            if total > MAX_SERVERS {
                return Err(SpecError::invalid(
                    file,
                    f("servers"),
                    format!("the cluster would exceed {MAX_SERVERS} servers"),
                ));
            }
            let topo = match (&r.topology, &r.topology_file) {
                (Some(name), None) => Topology::preset(name).ok_or_else(|| {
                    let known: Vec<&str> = crate::topology::PRESETS.iter().map(|(n, _)| *n).collect();
                    SpecError::invalid(
                        file,
                        f("topology"),
                        format!("unknown preset `{name}` (known: {})", known.join(", ")),
                    )
                })?,
                (None, Some(path)) => {
                    let p = dir.map(|d| d.join(path)).unwrap_or_else(|| Path::new(path).to_path_buf());
                    Topology::from_file(&p)?
                }
                (Some(_), Some(_)) => {
                    return Err(SpecError::invalid(
                        file,
                        f("topology"),
                        "give either `topology` or `topology_file`, not both",
                    ));
                }
                (None, None) => {
                    return Err(SpecError::invalid(
                        file,
                        f("topology"),
                        "missing: give `topology` (a preset name) or `topology_file`",
                    ));
                }
            };
            if let Some(prev) = ib_of_rack.get(&r.name)
                && prev != &r.ib_domain
            {
                return Err(SpecError::invalid(
                    file,
                    f("ib_domain"),
                    format!("rack `{}` is already in IB domain `{prev}`, not `{}`", r.name, r.ib_domain),
                ));
            }
            ib_of_rack.insert(r.name.clone(), r.ib_domain.clone());
            let t = spec.add_topology(topo, file, || f("topology"))?;
            if !seen_groups.insert((r.name.clone(), t)) {
                return Err(SpecError::invalid(
                    file,
                    f("name"),
                    format!(
                        "rack `{}` already has a group of topology `{}`; merge the two entries",
                        r.name, spec.topologies[t].name
                    ),
                ));
            }
            spec.groups.push(RackGroup {
                rack: r.name.clone(),
                ib_domain: r.ib_domain.clone(),
                topology: t,
                servers: r.servers,
            });
        }
        for (tenant, q) in &spec.quotas {
            if tenant.trim().is_empty() {
                return Err(SpecError::invalid(file, "quotas", "a tenant name must not be empty"));
            }
            if *q == 0 {
                return Err(SpecError::invalid(
                    file,
                    format!("quotas.{tenant}"),
                    "a quota of 0 GPUs admits nothing; remove the tenant or raise it",
                ));
            }
        }
        let mut class_quotas = 0;
        for (tenant, classes) in &spec.class_quotas {
            crate::policy::check_name("tenant", tenant)
                .map_err(|e| SpecError::invalid(file, "class_quotas", e.to_string()))?;
            for (class, q) in classes {
                let field = format!("class_quotas.{tenant}.{class}");
                if !spec.priorities.classes.contains_key(class) {
                    let known: Vec<&str> = spec.priorities.classes.keys().map(String::as_str).collect();
                    return Err(SpecError::invalid(
                        file,
                        field,
                        format!("no priority class `{class}` (this cluster has: {})", known.join(", ")),
                    ));
                }
                if *q == 0 {
                    return Err(SpecError::invalid(file, field, "a quota of 0 GPUs admits nothing at that class"));
                }
                class_quotas += 1;
            }
        }
        if class_quotas > crate::policy::MAX_CLASS_QUOTAS {
            let most = crate::policy::MAX_CLASS_QUOTAS;
            return Err(SpecError::invalid(file, "class_quotas", format!("at most {most} class quotas")));
        }
        Ok(spec)
    }

    /// Reads and validates a cluster spec file.
    pub fn from_file(path: &Path) -> Result<ClusterSpec, SpecError> {
        let text = SpecError::read(path)?;
        ClusterSpec::from_toml(&path.display().to_string(), &text, path.parent())
    }

    /// A cluster of `servers` identical servers, `servers_per_rack` to a rack and
    /// `racks_per_ib_domain` racks to an InfiniBand domain (used by benchmarks and tests).
    pub fn uniform(topology: Topology, servers: u32, servers_per_rack: u32, racks_per_ib_domain: u32) -> ClusterSpec {
        // Configuration-set ids are 16 bits: widen racks rather than overflow them.
        let per_rack = servers_per_rack.max(1).max(servers.div_ceil(MAX_CONFIG_SETS as u32));
        let per_ib = racks_per_ib_domain.max(1);
        let mut groups = Vec::new();
        let mut left = servers;
        let mut rack = 0u32;
        while left > 0 {
            let n = left.min(per_rack);
            groups.push(RackGroup {
                rack: format!("rack-{rack}"),
                ib_domain: format!("ib-{}", rack / per_ib),
                topology: 0,
                servers: n,
            });
            left -= n;
            rack += 1;
        }
        ClusterSpec {
            name: format!("uniform-{servers}"),
            topologies: vec![topology],
            groups,
            quotas: BTreeMap::new(),
            class_quotas: BTreeMap::new(),
            priorities: Priorities::default(),
            accounting: Accounting::default(),
        }
    }

    /// Writes the spec as files in `dir`: `cluster.toml`, naming each topology by its preset
    /// when it is one, and a `topology-N.toml` beside it for each topology that is not.
    /// [`ClusterSpec::from_file`] reads the returned path back equal. For tools that start
    /// `tessera view serve` processes from a spec built in code.
    pub fn write_files(&self, dir: &Path) -> Result<std::path::PathBuf, SpecError> {
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|source| SpecError::Io { file: path.display().to_string(), source })
        };
        let mut names = Vec::with_capacity(self.topologies.len());
        for (i, t) in self.topologies.iter().enumerate() {
            if Topology::preset(&t.name).as_ref() == Some(t) {
                names.push((Some(t.name.clone()), None));
            } else {
                let file = format!("topology-{i}.toml");
                write(&file, t.to_toml(&file)?)?;
                names.push((None, Some(file)));
            }
        }
        let raw = RawSpec {
            name: self.name.clone(),
            racks: self
                .groups
                .iter()
                .map(|g| RawRack {
                    name: g.rack.clone(),
                    ib_domain: g.ib_domain.clone(),
                    topology: names[g.topology].0.clone(),
                    topology_file: names[g.topology].1.clone(),
                    servers: g.servers,
                })
                .collect(),
            quotas: self.quotas.clone(),
            class_quotas: self.class_quotas.clone(),
            priorities: RawPriorities {
                classes: Some(self.priorities.classes.clone()),
                max_preemptions: Some(self.priorities.max_preemptions),
                attained_service_gpu_s: self.priorities.attained_service_gpu_s.clone(),
            },
            accounting: self.accounting,
        };
        let text = toml::to_string(&raw)
            .map_err(|e| SpecError::Syntax { file: "cluster.toml".into(), message: e.to_string() })?;
        write("cluster.toml", text)?;
        Ok(dir.join("cluster.toml"))
    }

    /// Total servers.
    pub fn server_count(&self) -> u64 {
        self.groups.iter().map(|g| g.servers as u64).sum()
    }

    /// The index of topology `t`, added unless an equal one is there. An error names the
    /// `field` of `file` that names `t`.
    fn add_topology(&mut self, t: Topology, file: &str, field: impl FnOnce() -> String) -> Result<usize, SpecError> {
        if let Some(i) = self.topologies.iter().position(|x| x.name == t.name) {
            if self.topologies[i] != t {
                let message = format!("two different topologies are both named `{}`", t.name);
                return Err(SpecError::invalid(file, field(), message));
            }
            return Ok(i);
        }
        if self.topologies.len() >= u16::MAX as usize {
            return Err(SpecError::invalid(file, field(), "too many distinct topologies"));
        }
        self.topologies.push(t);
        Ok(self.topologies.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back_equal() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut custom = Topology::preset("seed-8gpu").expect("preset");
        custom.name = "custom-8gpu".into();
        custom.memory_mib /= 2;
        let mut spec = ClusterSpec::uniform(Topology::preset("pcie-4gpu").expect("preset"), 10, 4, 2);
        spec.topologies.push(custom);
        spec.groups.push(RackGroup { rack: "rack-0".into(), ib_domain: "ib-0".into(), topology: 1, servers: 3 });
        spec.quotas.insert("vision".into(), 16);
        spec.priorities.classes.insert("urgent".into(), 1000);
        spec.priorities.max_preemptions = 5;
        spec.accounting.ended_jobs_kept = 7;
        let path = spec.write_files(dir.path()).expect("write");
        assert_eq!(ClusterSpec::from_file(&path).expect("read back"), spec);
        // The preset is named, the custom topology is a file of its own.
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(
            text.contains("topology = \"pcie-4gpu\"") && text.contains("topology_file = \"topology-1.toml\""),
            "{text}"
        );
        // Every preset survives its own file format.
        for (name, _) in crate::topology::PRESETS {
            let t = Topology::preset(name).expect("preset");
            assert_eq!(Topology::from_toml(name, &t.to_toml(name).expect("toml")).expect("parse"), t, "{name}");
        }
    }

    #[test]
    fn accounting_keeps_ended_jobs_within_bounds() {
        let base = "name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers=2\n";
        let parse = |extra: &str| ClusterSpec::from_toml("c.toml", &format!("{base}[accounting]\n{extra}\n"), None);
        let s = parse("ended_jobs_kept = 5").expect("valid");
        assert_eq!(s.accounting, Accounting { retention_days: 92, ended_jobs_kept: 5 });
        assert_eq!(
            crate::ClusterView::from_spec(&s).snapshot().ended_jobs_kept,
            5,
            "the view keeps what the spec says"
        );
        for bad in ["ended_jobs_kept = 0", "ended_jobs_kept = 1000001"] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.contains("accounting.ended_jobs_kept"), "{e}");
        }
    }

    #[test]
    fn parses_and_rejects() {
        let ok = "name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers=2\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='pcie-4gpu'\nservers=1\n";
        let s = ClusterSpec::from_toml("c.toml", ok, None).expect("valid");
        assert_eq!(s.server_count(), 3);
        assert_eq!(s.topologies.len(), 2);
        let bad = |t: &str| ClusterSpec::from_toml("c.toml", t, None).expect_err("invalid").to_string();
        let e = bad("name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='nope'\nservers=2\n");
        assert!(e.contains("racks[0].topology") && e.contains("unknown preset `nope`"), "{e}");
        let e = bad("name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers=0\n");
        assert!(e.contains("racks[0].servers"), "{e}");
        let e = bad(
            "name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers=1\n[[racks]]\nname='r0'\nib_domain='ib1'\ntopology='pcie-4gpu'\nservers=1\n",
        );
        assert!(e.contains("racks[1].ib_domain"), "{e}");
        let e = bad("name='c'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology_file='/nonexistent.toml'\nservers=1\n");
        assert!(e.contains("/nonexistent.toml") && e.contains("cannot read"), "{e}");
        let with = |tail: &str| format!("{ok}{tail}");
        let e = bad(&with("[priorities]\nclasses = {}\n"));
        assert!(e.contains("priorities.classes") && e.contains("at least one"), "{e}");
        let e = bad(&with("[priorities]\nmax_preemptions = -1\n"));
        assert!(e.contains("max_preemptions"), "{e}");
        let s = ClusterSpec::from_toml("c.toml", &with("[priorities]\nmax_preemptions = 0\n"), None).expect("valid");
        assert_eq!(s.priorities.max_preemptions, 0);
        assert_eq!(s.priorities.classes, Priorities::default().classes, "classes default when not given");
        let e = bad("name='c'\nracks=[]\n");
        assert!(e.contains("`racks`"), "{e}");
    }

    #[test]
    fn uniform_layout() {
        let t = Topology::preset("seed-8gpu").expect("preset");
        let s = ClusterSpec::uniform(t, 40, 16, 2);
        assert_eq!(s.groups.len(), 3);
        assert_eq!(s.groups[2].servers, 8);
        assert_eq!(s.groups[2].ib_domain, "ib-1");
    }
}
