//! Job specs (TOML), their resolved demands, and jobs as the view holds them.
//!
//! ```toml
//! name = "resnet50"
//! gpus = 8                  # total GPUs; or give `gpus_per_member`
//! members = 2               # gang members (tasks), each on one server; default 1
//! gpu_type = "nvidia-v100-16g"   # optional
//! tenant = "vision"         # optional, default "default"
//! priority = 0
//! memory_mib_per_gpu = 32768     # optional; default: the server's memory share per GPU
//! command = ["python3", "train.py"]
//!
//! [locality]
//! prefer = "socket"         # pcie-switch < socket < server < rack < ib-domain < any
//! tolerate = "rack"
//! relax_after_s = 600       # optional: loosen one level per this many seconds waited
//! slowdown = { server = 0.0, rack = 0.28 }   # optional: throughput lost per level (0..1)
//!
//! [cpu]                     # optional; default: the server's core share per GPU
//! cores_per_gpu = 4         # a fixed grant, or the predictor S(C) = P0 log C + P1 C (C < θ), P2:
//! # predictor = { p0 = 1.0, p1 = 0.02, p2 = 2.5, theta = 11.0 }
//! # min_cores_per_gpu = 2
//! ```

use crate::error::SpecError;
use crate::ids::{JobId, ViewVersion};
use crate::locality::LocalityLevel;
use crate::mask::{MAX_CORES, MAX_DEVICES};
use crate::placement::GangPlacement;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The most members one gang may have.
pub const MAX_MEMBERS: u32 = 4096;

/// The CPU-speed predictor `S(C) = P0·ln C + P1·C` for `C < θ`, `P2` for `C ≥ θ`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predictor {
    /// Coefficient of `ln C`.
    pub p0: f64,
    /// Coefficient of `C`.
    pub p1: f64,
    /// Throughput at and beyond the sweet point.
    pub p2: f64,
    /// The sweet point θ: cores per GPU for best speed.
    pub theta: f64,
}

impl Predictor {
    /// Predicted relative throughput with `cores` cores per GPU.
    pub fn speed(&self, cores: f64) -> f64 {
        if cores >= self.theta {
            self.p2
        } else if cores <= 0.0 {
            0.0
        } else {
            self.p0 * cores.ln() + self.p1 * cores
        }
    }
}

/// How many cores a job wants per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum CpuDemand {
    /// The server's cores divided evenly among its GPUs (what GPU-count-only schedulers do).
    Proportional,
    /// Exactly this many cores per GPU.
    Fixed {
        /// Cores per GPU.
        cores_per_gpu: u32,
    },
    /// From a speed predictor: want θ cores per GPU, accept down to `min_cores_per_gpu`.
    Predicted {
        /// The predictor.
        predictor: Predictor,
        /// The fewest cores per GPU the job accepts.
        min_cores_per_gpu: u32,
    },
}

/// A validated job spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Display name.
    pub name: String,
    /// Tenant, for quotas.
    pub tenant: String,
    /// Required device type, if any.
    pub gpu_type: Option<String>,
    /// Gang members; each member runs on one server.
    pub members: u32,
    /// GPUs per member.
    pub gpus_per_member: u32,
    /// Preferred (tightest wanted) locality level.
    pub prefer: LocalityLevel,
    /// Loosest tolerated locality level (never tighter than `prefer`).
    pub tolerate: LocalityLevel,
    /// Seconds of waiting after which the job accepts one level looser than before.
    pub relax_after_s: Option<u64>,
    /// Throughput lost at each level (0 = none, 0.28 = 28% slower), for cost-aware policies.
    pub slowdown: BTreeMap<LocalityLevel, f64>,
    /// CPU demand.
    pub cpu: CpuDemand,
    /// Memory per GPU in MiB; `None` = the server's memory share per GPU.
    pub memory_mib_per_gpu: Option<u32>,
    /// Higher runs first.
    pub priority: i32,
    /// The command each member runs (empty for simulated jobs).
    pub command: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: String,
    #[serde(default)]
    gpus: Option<u32>,
    #[serde(default)]
    members: Option<u32>,
    #[serde(default)]
    gpus_per_member: Option<u32>,
    #[serde(default)]
    gpu_type: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    memory_mib_per_gpu: Option<u32>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    locality: Option<RawLocality>,
    #[serde(default)]
    cpu: Option<RawCpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLocality {
    #[serde(default)]
    prefer: Option<LocalityLevel>,
    #[serde(default)]
    tolerate: Option<LocalityLevel>,
    #[serde(default)]
    relax_after_s: Option<u64>,
    #[serde(default)]
    slowdown: BTreeMap<LocalityLevel, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCpu {
    #[serde(default)]
    cores_per_gpu: Option<u32>,
    #[serde(default)]
    predictor: Option<Predictor>,
    #[serde(default)]
    min_cores_per_gpu: Option<u32>,
}

impl JobSpec {
    /// A plain job: `members` × `gpus_per_member` GPUs, the tightest sensible preference,
    /// tolerating anything, default CPU and memory.
    pub fn simple(name: &str, members: u32, gpus_per_member: u32) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            tenant: "default".to_string(),
            gpu_type: None,
            members,
            gpus_per_member,
            prefer: LocalityLevel::PcieSwitch,
            tolerate: LocalityLevel::Any,
            relax_after_s: None,
            slowdown: BTreeMap::new(),
            cpu: CpuDemand::Proportional,
            memory_mib_per_gpu: None,
            priority: 0,
            command: Vec::new(),
        }
    }

    /// Total GPUs of the gang.
    #[inline]
    pub fn total_gpus(&self) -> u32 {
        self.members * self.gpus_per_member
    }

    /// The loosest level the job accepts after waiting `waited_s` seconds.
    pub fn allowed_level(&self, waited_s: u64) -> LocalityLevel {
        match self.relax_after_s {
            Some(step) if step > 0 => self.prefer.relaxed_by((waited_s / step) as usize).min(self.tolerate),
            _ => self.tolerate,
        }
    }

    /// Parses and validates job TOML; `file` names the source in errors.
    pub fn from_toml(file: &str, text: &str) -> Result<JobSpec, SpecError> {
        let raw: RawJob = toml::from_str(text).map_err(|e| SpecError::syntax(file, &e))?;
        let inv = |field: &str, msg: String| SpecError::invalid(file, field, msg);
        if raw.name.trim().is_empty() {
            return Err(inv("name", "must not be empty".into()));
        }
        let members = raw.members.unwrap_or(1);
        if members == 0 || members > MAX_MEMBERS {
            return Err(inv("members", format!("must be 1..={MAX_MEMBERS}, got {members}")));
        }
        let gpus_per_member = match (raw.gpus, raw.gpus_per_member) {
            (None, None) => {
                return Err(inv("gpus", "missing: give `gpus` (total) or `gpus_per_member`".into()));
            }
            (Some(0), _) => return Err(inv("gpus", "must be at least 1".into())),
            (_, Some(0)) => return Err(inv("gpus_per_member", "must be at least 1".into())),
            (Some(g), None) => {
                if g % members != 0 {
                    return Err(inv("gpus", format!("{g} GPUs cannot be split evenly over {members} members")));
                }
                g / members
            }
            (None, Some(p)) => p,
            (Some(g), Some(p)) => {
                if g != p * members {
                    return Err(inv("gpus", format!("{g} != members ({members}) x gpus_per_member ({p})")));
                }
                p
            }
        };
        if gpus_per_member > MAX_DEVICES {
            return Err(inv(
                "gpus_per_member",
                format!("{gpus_per_member} GPUs per member; a server has at most {MAX_DEVICES}"),
            ));
        }
        let loc = raw.locality.unwrap_or(RawLocality {
            prefer: None,
            tolerate: None,
            relax_after_s: None,
            slowdown: BTreeMap::new(),
        });
        let prefer = loc.prefer.unwrap_or(LocalityLevel::PcieSwitch);
        let tolerate = loc.tolerate.unwrap_or(LocalityLevel::Any);
        if tolerate < prefer {
            return Err(inv("locality.tolerate", format!("`{tolerate}` is tighter than locality.prefer = `{prefer}`")));
        }
        if loc.relax_after_s == Some(0) {
            return Err(inv("locality.relax_after_s", "must be at least 1 second".into()));
        }
        for (level, s) in &loc.slowdown {
            if !(0.0..1.0).contains(s) {
                return Err(inv(&format!("locality.slowdown.{level}"), format!("must be in [0, 1), got {s}")));
            }
        }
        let cpu = match raw.cpu {
            None => CpuDemand::Proportional,
            Some(RawCpu { cores_per_gpu: Some(_), predictor: Some(_), .. }) => {
                return Err(inv("cpu", "give either `cores_per_gpu` or `predictor`, not both".into()));
            }
            Some(RawCpu { cores_per_gpu: Some(c), min_cores_per_gpu, .. }) => {
                if c == 0 || c > MAX_CORES {
                    return Err(inv("cpu.cores_per_gpu", format!("must be 1..={MAX_CORES}, got {c}")));
                }
                if min_cores_per_gpu.is_some() {
                    return Err(inv("cpu.min_cores_per_gpu", "only applies with `predictor`".into()));
                }
                CpuDemand::Fixed { cores_per_gpu: c }
            }
            Some(RawCpu { predictor: Some(p), min_cores_per_gpu, .. }) => {
                if !(p.theta.is_finite() && p.theta >= 1.0 && p.theta <= MAX_CORES as f64) {
                    return Err(inv(
                        "cpu.predictor.theta",
                        format!("must be a number in 1..={MAX_CORES}, got {}", p.theta),
                    ));
                }
                for (name, v) in [("p0", p.p0), ("p1", p.p1), ("p2", p.p2)] {
                    if !v.is_finite() {
                        return Err(inv(&format!("cpu.predictor.{name}"), "must be a finite number".into()));
                    }
                }
                let min = min_cores_per_gpu.unwrap_or(1);
                if min == 0 || min as f64 > p.theta.ceil() {
                    return Err(inv(
                        "cpu.min_cores_per_gpu",
                        format!("must be 1..={} (θ rounded up), got {min}", p.theta.ceil()),
                    ));
                }
                CpuDemand::Predicted { predictor: p, min_cores_per_gpu: min }
            }
            Some(RawCpu { min_cores_per_gpu: Some(_), .. }) => {
                return Err(inv("cpu.min_cores_per_gpu", "only applies with `predictor`".into()));
            }
            Some(_) => CpuDemand::Proportional,
        };
        if raw.memory_mib_per_gpu == Some(0) {
            return Err(inv("memory_mib_per_gpu", "must be at least 1 (omit it for the server's share)".into()));
        }
        if let Some(t) = &raw.gpu_type {
            if t.trim().is_empty() {
                return Err(inv("gpu_type", "must not be empty (omit it for any type)".into()));
            }
        }
        if raw.command.first().is_some_and(|c| c.trim().is_empty()) {
            return Err(inv("command", "the program name must not be empty".into()));
        }
        Ok(JobSpec {
            name: raw.name,
            tenant: raw.tenant.unwrap_or_else(|| "default".into()),
            gpu_type: raw.gpu_type,
            members,
            gpus_per_member,
            prefer,
            tolerate,
            relax_after_s: loc.relax_after_s,
            slowdown: loc.slowdown,
            cpu,
            memory_mib_per_gpu: raw.memory_mib_per_gpu,
            priority: raw.priority,
            command: raw.command,
        })
    }

    /// Reads and validates a job file.
    pub fn from_file(path: &Path) -> Result<JobSpec, SpecError> {
        let text = SpecError::read(path)?;
        JobSpec::from_toml(&path.display().to_string(), &text)
    }
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Waiting for a placement.
    Pending,
    /// Placed; its tasks are being started.
    Placed,
    /// Its tasks run.
    Running,
    /// Being moved by the migration module.
    Migrating,
    /// Ended normally; resources released.
    Finished,
    /// Ended in failure or was cancelled; resources released.
    Failed,
}

impl JobState {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Placed => "placed",
            JobState::Running => "running",
            JobState::Migrating => "migrating",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
        }
    }

    /// Whether the job holds resources in this state.
    pub fn holds_resources(self) -> bool {
        matches!(self, JobState::Placed | JobState::Running | JobState::Migrating)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as the view holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// What it asked for.
    pub spec: JobSpec,
    /// Its state.
    pub state: JobState,
    /// Its placement while it holds resources.
    pub placement: Option<GangPlacement>,
    /// The view version at which it was submitted.
    pub submitted_at: ViewVersion,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        JobSpec::from_toml("j.toml", text).map(|_| ()).expect_err("must fail").to_string()
    }

    #[test]
    fn parses_full_spec() {
        let j = JobSpec::from_toml(
            "j.toml",
            "name='r'\ngpus=8\nmembers=2\n[locality]\nprefer='socket'\ntolerate='rack'\nrelax_after_s=60\nslowdown={rack=0.28}\n[cpu]\npredictor={p0=1.0,p1=0.1,p2=3.0,theta=11.0}\nmin_cores_per_gpu=2\n",
        )
        .expect("valid");
        assert_eq!((j.members, j.gpus_per_member), (2, 4));
        assert_eq!(j.allowed_level(0), LocalityLevel::Socket);
        assert_eq!(j.allowed_level(61), LocalityLevel::Server);
        assert_eq!(j.allowed_level(10_000), LocalityLevel::Rack);
        assert!(matches!(j.cpu, CpuDemand::Predicted { min_cores_per_gpu: 2, .. }));
    }

    #[test]
    fn bad_specs_name_the_field() {
        assert!(err("name='r'\ngpus=0\n").contains("field `gpus`"));
        assert!(err("name='r'\n").contains("field `gpus`"));
        let e = err("name='r'\ngpus=4\n[locality]\nprefer='server'\ntolerate='socket'\n");
        assert!(e.contains("locality.tolerate") && e.contains("tighter"), "{e}");
        assert!(err("name='r'\ngpus=5\nmembers=2\n").contains("evenly"));
        assert!(err("name='r'\ngpus=4\ngpus_per_member=3\n").contains("field `gpus`"));
        assert!(err("name='r'\ngpus_per_member=65\n").contains("gpus_per_member"));
        assert!(err("name='r'\ngpus=1\n[cpu]\ncores_per_gpu=0\n").contains("cpu.cores_per_gpu"));
        assert!(
            err("name='r'\ngpus=1\n[cpu]\ncores_per_gpu=2\npredictor={p0=1.0,p1=0.0,p2=1.0,theta=3.0}\n")
                .contains("not both")
        );
        assert!(err("name='r'\ngpus=1\n[cpu]\npredictor={p0=1.0,p1=0.0,p2=1.0,theta=0.5}\n").contains("theta"));
        assert!(err("name='r'\ngpus=1\n[locality]\nslowdown={rack=1.5}\n").contains("locality.slowdown.rack"));
        assert!(err("name='r'\ngpus=1\n[locality]\nprefer='rackk'\n").contains("rackk"));
        assert!(err("name='r'\ngpus=1\nbogus=2\n").contains("bogus"));
        let e = err("name='r'\ngpus='four'\n");
        assert!(e.contains("j.toml") && e.contains("line 2"), "{e}");
    }
}
