//! Job specs (TOML), their resolved demands, and jobs as the view holds them.
//!
//! ```toml
//! name = "resnet50"
//! gpus = 8                  # total GPUs; or give `gpus_per_member`
//! members = 2               # gang members (tasks), each on one server; default 1
//! gpu_type = "nvidia-v100-16g"   # optional
//! tenant = "vision"         # optional, default "default"
//! priority = "batch"       # a class of the cluster's [priorities] (resolved at admission), or a number
//! memory_mib_per_gpu = 32768     # optional; default: the server's memory share per GPU
//! model = "ResNet-50"       # optional: what it trains; without a declared `slowdown` the job is
//!                           # admitted with the speed model's losses for it (`SpeedModel`)
//! command = ["python3", "train.py"]
//! restart = { max = 3, backoff_s = 10 }  # optional: after a member fails, restart the gang
//!                           # whole, at most 3 times, waiting 10 s, 20 s, 40 s
//! stop_grace_s = 30         # optional: SIGTERM to SIGKILL when its tasks are stopped
//! after = [41, 42]          # optional: placed only once jobs 41 and 42 finished (a failed one
//!                           # fails this job too); `after_any = [..]`: once they ended at all
//! array = 16                # optional: 16 jobs of this spec (TESSERA_ARRAY_INDEX 0..15)
//!
//! [locality]
//! prefer = "socket"         # pcie-switch < socket < server < rack < ib-domain < any
//! tolerate = "rack"
//! relax_after_s = 600       # optional: loosen one level per this many seconds waited
//! slowdown = { server = 0.0, rack = 0.28 }   # optional: throughput lost per level (0..1);
//!                           # a level declared 0 (and every one before it) is accepted at once
//!
//! [cpu]                     # optional; default: the server's core share per GPU
//! cores_per_gpu = 4         # a fixed grant, or the predictor S(C) = P0 log C + P1 C (C < θ), P2:
//! # predictor = { p0 = 1.0, p1 = 0.02, p2 = 2.5, theta = 11.0 }
//! # min_cores_per_gpu = 2
//! ```

use crate::error::{FieldError, SpecError};
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

/// The longest `model` name a spec may give, in characters.
pub const MAX_MODEL_LEN: usize = 128;

/// The tenant of a job whose spec names none.
pub const DEFAULT_TENANT: &str = "default";

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

    /// Checks the predictor: θ a number in `1..=128` and finite coefficients. Fields are named
    /// `theta`, `p0`, `p1`, `p2`.
    pub fn validate(&self) -> Result<(), FieldError> {
        if !(self.theta.is_finite() && self.theta >= 1.0 && self.theta <= f64::from(MAX_CORES)) {
            return Err(FieldError::new("theta", format!("must be a number in 1..={MAX_CORES}, got {}", self.theta)));
        }
        for (name, v) in [("p0", self.p0), ("p1", self.p1), ("p2", self.p2)] {
            if !v.is_finite() {
                return Err(FieldError::new(name, format!("must be a finite number, got {v}")));
            }
        }
        Ok(())
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

impl CpuDemand {
    /// Checks the demand: a fixed grant of 1..=128 cores per GPU, or a valid predictor (see
    /// [`Predictor::validate`]) with a minimum of 1..=⌈θ⌉ cores per GPU. Fields are named as in
    /// the `[cpu]` table of a job file: `cores_per_gpu`, `predictor.theta`, `min_cores_per_gpu`.
    pub fn validate(&self) -> Result<(), FieldError> {
        match *self {
            CpuDemand::Proportional => Ok(()),
            CpuDemand::Fixed { cores_per_gpu: c } => {
                if c == 0 || c > MAX_CORES {
                    return Err(FieldError::new("cores_per_gpu", format!("must be 1..={MAX_CORES}, got {c}")));
                }
                Ok(())
            }
            CpuDemand::Predicted { predictor, min_cores_per_gpu: min } => {
                predictor.validate().map_err(|e| e.within("predictor"))?;
                let max = predictor.theta.ceil();
                if min == 0 || f64::from(min) > max {
                    return Err(FieldError::new(
                        "min_cores_per_gpu",
                        format!("must be 1..={max} (θ rounded up), got {min}"),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// A validated job spec. [`JobSpec::from_toml`] and [`JobSpec::from_file`] validate; a value
/// built any other way (its fields are public) is checked with [`JobSpec::validate`].
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
    /// Throughput lost at each level (0 = none, 0.28 = 28% slower): a level declared 0 is
    /// accepted without waiting ([`JobSpec::allowed_level`]), and a lossy one when starting
    /// there now is expected to finish sooner than waiting for a tighter one (the scheduler
    /// crate's `locality_cost`).
    pub slowdown: BTreeMap<LocalityLevel, f64>,
    /// CPU demand.
    pub cpu: CpuDemand,
    /// Memory per GPU in MiB; `None` = the server's memory share per GPU.
    pub memory_mib_per_gpu: Option<u32>,
    /// Higher runs first, and may preempt lower. Set from `class` when the view admits the job.
    pub priority: i32,
    /// The priority class the job named, if it named one; the view resolves it to `priority`
    /// at admission ([`crate::Priorities::resolve`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The deep-learning model it trains, as the speed model knows it (`ResNet-50`, `LM`, or a
    /// class name). A spec that declares no `slowdown` is admitted with that model's losses
    /// ([`crate::SpeedModel::default_slowdown`], on the leader before the entry is written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The command each member runs (empty for simulated jobs).
    pub command: Vec<String>,
    /// The scheduler that places the job, by the name a scheduler host knows it by
    /// (`locality-tolerant`, `cpu-aware`, `optimus`, or one of your own; `default` is the old
    /// name of `locality-tolerant`); the host's default when `None`.
    #[serde(default)]
    pub scheduler: Option<String>,
    /// How each member's task runs: environment, working directory, time limit.
    #[serde(default, skip_serializing_if = "RunSettings::is_default")]
    pub run: RunSettings,
    /// Jobs that must have *finished* before this one is placed; one that fails or is
    /// cancelled fails this one too. Naming the first job of an array waits for the whole
    /// array.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    /// Jobs that must have ended, in any state, before this one is placed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<JobId>,
    /// Admit this many jobs of this spec at once (consecutive ids; each task sees its index as
    /// `TESSERA_ARRAY_INDEX`); `None`: one job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<u32>,
}

/// The loosest level reachable from `from` through levels that `slowdown` declares 0 at: how far
/// a job that prefers `from` is accepted at once ([`JobSpec::allowed_level`]). A level it does
/// not declare stops the walk (declaring nothing says nothing about what the job loses).
pub fn free_level(from: LocalityLevel, slowdown: &BTreeMap<LocalityLevel, f64>) -> LocalityLevel {
    let mut level = from;
    while level < LocalityLevel::Any {
        let next = level.relaxed_by(1);
        if slowdown.get(&next) != Some(&0.0) {
            break;
        }
        level = next;
    }
    level
}

/// The most environment variables a job sets.
pub const MAX_ENV_VARS: usize = 128;
/// The longest environment value or working directory, bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 4096;
/// The longest time limit: one year.
pub const MAX_TIME_LIMIT_S: u64 = 366 * 86_400;
/// The most jobs a job may wait for (`after` and `after_any` together).
pub const MAX_DEPENDENCIES: usize = 64;
/// The most jobs one array submission admits.
pub const MAX_ARRAY: u32 = 1_000;
/// The most restarts a job may ask for.
pub const MAX_RESTARTS: u32 = 100;
/// The longest wait before a restart, in seconds (the doubling backoff stops growing there).
pub const MAX_RESTART_BACKOFF_S: u64 = 3_600;
/// The first restart's wait when a job's policy gives none, in seconds.
pub const DEFAULT_RESTART_BACKOFF_S: u64 = 10;
/// The longest stop grace a job may ask for, in seconds.
pub const MAX_STOP_GRACE_S: u64 = 3_600;

/// What happens when a member of a running job fails (exits non-zero, or cannot start): the
/// gang is released whole and queued again, up to `max` times, each restart waiting twice as
/// long as the one before (from `backoff_s`, at most [`MAX_RESTART_BACKOFF_S`]). At the next
/// failure the job fails. A cancel, a time limit, a preemption or a lost server is not a
/// failure of the job's code and restarts nothing (the last two re-queue it anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartPolicy {
    /// Restarts allowed (1..=[`MAX_RESTARTS`]).
    pub max: u32,
    /// Seconds before the first restart may be placed (0..=[`MAX_RESTART_BACKOFF_S`]).
    #[serde(default = "default_restart_backoff")]
    pub backoff_s: u64,
}

fn default_restart_backoff() -> u64 {
    DEFAULT_RESTART_BACKOFF_S
}

impl RestartPolicy {
    /// The wait before restart number `n` (1 for the first), in milliseconds: `backoff_s`
    /// doubled `n - 1` times, at most [`MAX_RESTART_BACKOFF_S`].
    pub fn backoff_ms(&self, n: u32) -> u64 {
        let doubled = self.backoff_s.saturating_mul(1u64 << n.saturating_sub(1).min(20));
        doubled.min(MAX_RESTART_BACKOFF_S) * 1000
    }

    fn validate(&self) -> Result<(), FieldError> {
        if !(1..=MAX_RESTARTS).contains(&self.max) {
            return Err(FieldError::new("restart.max", format!("must be 1..={MAX_RESTARTS}, got {}", self.max)));
        }
        if self.backoff_s > MAX_RESTART_BACKOFF_S {
            return Err(FieldError::new(
                "restart.backoff_s",
                format!("must be at most {MAX_RESTART_BACKOFF_S} seconds, got {}", self.backoff_s),
            ));
        }
        Ok(())
    }
}
/// Variables the node agent sets for every task; a job may not set them itself.
pub const RESERVED_ENV: [&str; 11] = [
    "CUDA_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "PATH",
    "HOME",
    "USER",
];

/// How a job's tasks run, beyond the command: what a batch system lets a job set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    /// Environment variables added to each task's (not the agent's own: `TESSERA_*` and
    /// [`RESERVED_ENV`] are refused).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The absolute directory each task starts in (the agent's own when `None`); a task whose
    /// directory does not exist on its server fails, saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The longest a placement may be held, in seconds from its approval; past it the view
    /// fails the job ("time limit reached") and its agents stop its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_s: Option<u64>,
    /// Restart the gang whole when a member fails, up to a bound (none: a failure ends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartPolicy>,
    /// Seconds a stopped task has between SIGTERM and SIGKILL (a cancel, a time limit, a
    /// restart of its gang); none: the agent's own setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_grace_s: Option<u64>,
}

impl RunSettings {
    /// Whether nothing is set.
    pub fn is_default(&self) -> bool {
        *self == RunSettings::default()
    }

    /// Checks names, sizes and ranges; fields are named as in job files (`env.NAME`,
    /// `workdir`, `time_limit_s`).
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.env.len() > MAX_ENV_VARS {
            return Err(FieldError::new("env", format!("at most {MAX_ENV_VARS} variables, got {}", self.env.len())));
        }
        for (k, v) in &self.env {
            let name_ok = k.len() <= 256
                && k.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !name_ok {
                return Err(FieldError::new("env", format!("`{k}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")));
            }
            if k.starts_with("TESSERA_") || RESERVED_ENV.contains(&k.as_str()) {
                return Err(FieldError::new(format!("env.{k}"), "is set by the node agent; a job may not set it"));
            }
            if v.len() > MAX_ENV_VALUE_BYTES || v.contains('\0') {
                return Err(FieldError::new(
                    format!("env.{k}"),
                    format!("must be at most {MAX_ENV_VALUE_BYTES} bytes without NUL"),
                ));
            }
        }
        if let Some(w) = &self.workdir
            && (!w.starts_with('/') || w.len() > MAX_ENV_VALUE_BYTES || w.contains('\0'))
        {
            return Err(FieldError::new(
                "workdir",
                format!("`{w}` must be an absolute path (at most {MAX_ENV_VALUE_BYTES} bytes)"),
            ));
        }
        if let Some(t) = self.time_limit_s
            && !(1..=MAX_TIME_LIMIT_S).contains(&t)
        {
            return Err(FieldError::new("time_limit_s", format!("must be 1..={MAX_TIME_LIMIT_S} seconds, got {t}")));
        }
        if let Some(r) = &self.restart {
            r.validate()?;
        }
        if let Some(g) = self.stop_grace_s
            && g > MAX_STOP_GRACE_S
        {
            return Err(FieldError::new(
                "stop_grace_s",
                format!("must be at most {MAX_STOP_GRACE_S} seconds, got {g}"),
            ));
        }
        Ok(())
    }
}

/// A job file as written (TOML, or the same shape in JSON): `gpus` or `gpus_per_member`, and
/// the `[locality]` and `[cpu]` tables. Deserialize it with any serde format, then
/// [`JobFile::into_spec`] resolves and validates it: the one path from a job file to a
/// [`JobSpec`] ([`JobSpec::from_toml`] and the HTTP API's JSON and TOML bodies all take it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// Optional here so that a missing name is reported like every other field (by its path).
    #[serde(default)]
    name: Option<String>,
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
    priority: Option<RawPriority>,
    #[serde(default)]
    memory_mib_per_gpu: Option<u32>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    scheduler: Option<String>,
    #[serde(default)]
    locality: Option<RawLocality>,
    #[serde(default)]
    cpu: Option<RawCpu>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    time_limit_s: Option<u64>,
    #[serde(default)]
    restart: Option<RestartPolicy>,
    #[serde(default)]
    stop_grace_s: Option<u64>,
    #[serde(default)]
    after: Vec<JobId>,
    #[serde(default)]
    after_any: Vec<JobId>,
    #[serde(default)]
    array: Option<u32>,
}

/// `priority = 10` or `priority = "batch"` (a class name).
#[derive(Debug)]
enum RawPriority {
    Number(i32),
    Class(String),
}

impl<'de> Deserialize<'de> for RawPriority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawPriority;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number (e.g. 10) or a priority class of the cluster (e.g. \"batch\")")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawPriority, E> {
                i32::try_from(v)
                    .map(RawPriority::Number)
                    .map_err(|_| E::custom(format!("priority {v} is out of range")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawPriority, E> {
                i32::try_from(v)
                    .map(RawPriority::Number)
                    .map_err(|_| E::custom(format!("priority {v} is out of range")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawPriority, E> {
                Ok(RawPriority::Class(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCpu {
    #[serde(default)]
    cores_per_gpu: Option<u32>,
    #[serde(default)]
    predictor: Option<Predictor>,
    #[serde(default)]
    min_cores_per_gpu: Option<u32>,
}

impl JobFile {
    /// Resolves and validates the file's fields into a [`JobSpec`].
    ///
    /// Only what a built [`JobSpec`] cannot express is checked here (`gpus` missing, zero, or
    /// disagreeing with `members` and `gpus_per_member`; both `cores_per_gpu` and `predictor`;
    /// `min_cores_per_gpu` without `predictor`); the rest is [`JobSpec::validate`]'s. Fields are
    /// named as in the file (`gpus`, `cpu.min_cores_per_gpu`, `locality.tolerate`).
    pub fn into_spec(self) -> Result<JobSpec, FieldError> {
        let inv = |field: &str, msg: String| FieldError::new(field, msg);
        let Some(name) = self.name else { return Err(inv("name", "missing: every job needs a name".into())) };
        let members = self.members.unwrap_or(1);
        // `members` itself (0 included) is `validate`'s; 0 only skips the arithmetic here.
        let gpus_per_member = match (self.gpus, self.gpus_per_member) {
            (None, None) => {
                return Err(inv("gpus", "missing: give `gpus` (total) or `gpus_per_member`".into()));
            }
            (Some(0), _) => return Err(inv("gpus", "must be at least 1".into())),
            (Some(g), None) => {
                if members != 0 && g % members != 0 {
                    return Err(inv("gpus", format!("{g} GPUs cannot be split evenly over {members} members")));
                }
                g.checked_div(members).unwrap_or(0)
            }
            (Some(g), Some(p)) => {
                if members != 0 && p != 0 && u64::from(g) != u64::from(p) * u64::from(members) {
                    return Err(inv("gpus", format!("{g} != members ({members}) x gpus_per_member ({p})")));
                }
                p
            }
            (None, Some(p)) => p,
        };
        let loc = self.locality.unwrap_or(RawLocality {
            prefer: None,
            tolerate: None,
            relax_after_s: None,
            slowdown: BTreeMap::new(),
        });
        let cpu = match self.cpu {
            None => CpuDemand::Proportional,
            Some(RawCpu { cores_per_gpu: Some(_), predictor: Some(_), .. }) => {
                return Err(inv("cpu", "give either `cores_per_gpu` or `predictor`, not both".into()));
            }
            Some(RawCpu { predictor: None, min_cores_per_gpu: Some(_), .. }) => {
                return Err(inv("cpu.min_cores_per_gpu", "only applies with `predictor`".into()));
            }
            Some(RawCpu { cores_per_gpu: Some(c), .. }) => CpuDemand::Fixed { cores_per_gpu: c },
            Some(RawCpu { predictor: Some(p), min_cores_per_gpu, .. }) => {
                CpuDemand::Predicted { predictor: p, min_cores_per_gpu: min_cores_per_gpu.unwrap_or(1) }
            }
            Some(_) => CpuDemand::Proportional,
        };
        let (priority, class) = match self.priority {
            None => (0, None),
            Some(RawPriority::Number(p)) => (p, None),
            Some(RawPriority::Class(c)) => (0, Some(c)),
        };
        let spec = JobSpec {
            name,
            tenant: self.tenant.unwrap_or_else(|| DEFAULT_TENANT.into()),
            gpu_type: self.gpu_type,
            members,
            gpus_per_member,
            prefer: loc.prefer.unwrap_or(LocalityLevel::PcieSwitch),
            tolerate: loc.tolerate.unwrap_or(LocalityLevel::Any),
            relax_after_s: loc.relax_after_s,
            slowdown: loc.slowdown,
            cpu,
            memory_mib_per_gpu: self.memory_mib_per_gpu,
            priority,
            class,
            model: self.model,
            command: self.command,
            scheduler: self.scheduler,
            run: RunSettings {
                env: self.env,
                workdir: self.workdir,
                time_limit_s: self.time_limit_s,
                restart: self.restart,
                stop_grace_s: self.stop_grace_s,
            },
            after: self.after,
            after_any: self.after_any,
            array: self.array,
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl JobSpec {
    /// A plain job: `members` × `gpus_per_member` GPUs, the tightest sensible preference,
    /// tolerating anything, default CPU and memory.
    pub fn simple(name: &str, members: u32, gpus_per_member: u32) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            tenant: DEFAULT_TENANT.to_string(),
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
            class: None,
            model: None,
            command: Vec::new(),
            scheduler: None,
            run: RunSettings::default(),
            after: Vec::new(),
            after_any: Vec::new(),
            array: None,
        }
    }

    /// Total GPUs of the gang.
    #[inline]
    pub fn total_gpus(&self) -> u32 {
        self.members * self.gpus_per_member
    }

    /// The loosest level the job accepts after waiting `waited_s` seconds: `prefer` loosened one
    /// level per `relax_after_s`, and at once as far as the job declares no slowdown (a level
    /// whose `slowdown` is 0, with every level between `prefer` and it declared 0 too: waiting
    /// for a tighter placement would gain the job nothing). Never beyond `tolerate`. With no
    /// timer, a job that declares no slowdown accepts `tolerate` at once; one that declares a
    /// slowdown accepts this floor, and its host weighs the looser levels by their cost (the
    /// scheduler crate's `locality_cost`).
    pub fn allowed_level(&self, waited_s: u64) -> LocalityLevel {
        let by_time = match self.relax_after_s {
            Some(step) if step > 0 => self.prefer.relaxed_by((waited_s / step) as usize),
            // A declared cost and no timer: looser levels are weighed by the scheduler's host
            // (`locality_cost` in the scheduler crate), from `prefer` up.
            _ if !self.slowdown.is_empty() => self.prefer,
            _ => return self.tolerate,
        };
        by_time.max(self.free_level()).min(self.tolerate)
    }

    /// The loosest level reachable from `prefer` through levels the job declares no slowdown at.
    fn free_level(&self) -> LocalityLevel {
        free_level(self.prefer, &self.slowdown)
    }

    /// Parses and validates job TOML (a [`JobFile`], then [`JobFile::into_spec`]); `file` names
    /// the source in errors.
    pub fn from_toml(file: &str, text: &str) -> Result<JobSpec, SpecError> {
        JobSpec::parse_toml(file, text).map_err(|e| e.with_line(text))
    }

    fn parse_toml(file: &str, text: &str) -> Result<JobSpec, SpecError> {
        let raw: JobFile = toml::from_str(text).map_err(|e| SpecError::syntax(file, &e))?;
        raw.into_spec().map_err(|e| e.in_file(file))
    }

    /// Checks every guarantee of a job spec, for a value built in code or decoded from outside:
    /// a non-empty name; 1..=4096 members of 1..=64 GPUs; `tolerate` no tighter than `prefer`; a
    /// relaxation step of at least one second; slowdowns in `[0, 1)`; a valid CPU demand (see
    /// [`CpuDemand::validate`]); non-zero memory when given; a non-empty GPU type when given; a
    /// non-empty program name when a command is given.
    ///
    /// Fields are named as in job files: `locality.tolerate`, `locality.slowdown.rack`,
    /// `cpu.cores_per_gpu`, ...
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, msg: String| Err(FieldError::new(field, msg));
        if self.tenant.trim().is_empty() {
            return Err(FieldError::new("tenant", "must not be empty (omit it for `default`)"));
        }
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty".into());
        }
        if self.members == 0 || self.members > MAX_MEMBERS {
            return bad("members", format!("must be 1..={MAX_MEMBERS}, got {}", self.members));
        }
        if self.gpus_per_member == 0 {
            return bad("gpus_per_member", "must be at least 1".into());
        }
        if self.gpus_per_member > MAX_DEVICES {
            return bad(
                "gpus_per_member",
                format!("{} GPUs per member; a server has at most {MAX_DEVICES}", self.gpus_per_member),
            );
        }
        let (prefer, tolerate) = (self.prefer, self.tolerate);
        if tolerate < prefer {
            return bad("locality.tolerate", format!("`{tolerate}` is tighter than locality.prefer = `{prefer}`"));
        }
        if self.relax_after_s == Some(0) {
            return bad("locality.relax_after_s", "must be at least 1 second".into());
        }
        for (level, s) in &self.slowdown {
            if !(0.0..1.0).contains(s) {
                return bad(&format!("locality.slowdown.{level}"), format!("must be in [0, 1), got {s}"));
            }
        }
        self.cpu.validate().map_err(|e| e.within("cpu"))?;
        if self.memory_mib_per_gpu == Some(0) {
            return bad("memory_mib_per_gpu", "must be at least 1 (omit it for the server's share)".into());
        }
        if self.gpu_type.as_ref().is_some_and(|t| t.trim().is_empty()) {
            return bad("gpu_type", "must not be empty (omit it for any type)".into());
        }
        if self.command.first().is_some_and(|c| c.trim().is_empty()) {
            return bad("command", "the program name must not be empty".into());
        }
        self.run.validate()?;
        self.validate_dependencies()?;
        if let Some(name) = &self.scheduler
            && (name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'))
        {
            return bad(
                "scheduler",
                format!("`{name}` is not a scheduler name (1 to 64 of a-z, 0-9, `-`, `_`; omit it for the default)"),
            );
        }
        if let Some(class) = &self.class
            && (class.trim().is_empty() || class.len() > 64 || class.chars().any(char::is_whitespace))
        {
            return bad("priority", format!("`{class}` is not a class name (1 to 64 characters, no spaces)"));
        }
        if let Some(model) = &self.model
            && (model.trim().is_empty() || model.chars().count() > MAX_MODEL_LEN || model.chars().any(char::is_control))
        {
            return bad(
                "model",
                format!(
                    "must be 1 to {MAX_MODEL_LEN} characters, not blank, without control characters (got {})",
                    model.chars().count()
                ),
            );
        }
        Ok(())
    }

    /// `after`, `after_any` and `array`: at most [`MAX_DEPENDENCIES`] jobs, none named twice,
    /// no job id 0; an array of 1..=[`MAX_ARRAY`] jobs.
    fn validate_dependencies(&self) -> Result<(), FieldError> {
        let deps = self.after.len() + self.after_any.len();
        if deps > MAX_DEPENDENCIES {
            return Err(FieldError::new("after", format!("at most {MAX_DEPENDENCIES} jobs to wait for, got {deps}")));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (field, id) in
            self.after.iter().map(|j| ("after", j)).chain(self.after_any.iter().map(|j| ("after_any", j)))
        {
            if id.0 == 0 {
                return Err(FieldError::new(field, "job ids start at 1"));
            }
            if !seen.insert(*id) {
                return Err(FieldError::new(field, format!("job {id} is named twice")));
            }
        }
        if let Some(n) = self.array
            && !(1..=MAX_ARRAY).contains(&n)
        {
            return Err(FieldError::new("array", format!("must be 1..={MAX_ARRAY} jobs, got {n}")));
        }
        Ok(())
    }

    /// Every job this one waits for, each with whether it must have finished (`after`) rather
    /// than merely ended (`after_any`).
    pub fn dependencies(&self) -> impl Iterator<Item = (JobId, bool)> + '_ {
        self.after.iter().map(|j| (*j, true)).chain(self.after_any.iter().map(|j| (*j, false)))
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

/// Where one gang member's task is, as its node agent reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    /// Placed; its agent has not reported it started.
    #[default]
    Starting,
    /// Its process runs.
    Running,
    /// It exited with status 0.
    Succeeded,
}

impl TaskState {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Starting => "starting",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
        }
    }
}

/// What a node agent reports about one member's task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskEvent {
    /// The task's process started.
    Started,
    /// The task ended: `code` 0 is success; anything else (a signal, a command that could not
    /// start, a placement the server cannot honour) fails the job, and `message` says why.
    Exited {
        /// Exit status (negative: killed by signal `-code`).
        code: i32,
        /// Why, in words (empty for a plain exit).
        message: String,
    },
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
    /// Every proposal id ever applied for this job, oldest first. The approver applies an id
    /// at most once: a late retry of a spent id is refused, never re-applied.
    pub proposals: Vec<crate::ProposalId>,
    /// One state per member of the current placement (empty without one).
    #[serde(default)]
    pub tasks: Vec<TaskState>,
    /// Why the job last failed or was re-queued, if it did.
    #[serde(default)]
    pub error: Option<String>,
    /// The client's id for the submission that admitted it, if it gave one; a retry under the
    /// same id is answered with this job instead of admitting another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::RequestId>,
    /// How many times a higher-priority job preempted it; at the cluster's
    /// [`crate::Priorities::max_preemptions`] it is not preempted again.
    #[serde(default)]
    pub preemptions: u32,
    /// Its attained-service queue (0 = the least service), set by the host that holds it
    /// ([`crate::Command::SetServiceQueue`]). Within one priority, a job may preempt jobs of a
    /// higher queue.
    #[serde(default)]
    pub service_queue: u8,
    /// Who submitted it: the authenticated caller's name, never the request body's ("" when
    /// submitted without an identity).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// Its wall-clock times, from the view's clock.
    #[serde(default)]
    pub times: crate::usage::JobTimes,
    /// The spans it held placements, oldest first (one per placement released); the span of
    /// the placement it holds now is not here until released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<crate::usage::HeldSpan>,
    /// Restarts after failures so far (its spec's [`RestartPolicy`] bounds them).
    #[serde(default)]
    pub restarts: u32,
    /// A restarted job is not to be placed before this time on the view's clock (Unix ms);
    /// 0: any time. Hosts wait for it ([`crate::JobSpec::run`]'s `restart.backoff_s`).
    #[serde(default)]
    pub not_before_ms: u64,
    /// The jobs it still waits for, each with whether it must finish (`after`) rather than
    /// merely end (`after_any`); an array named in its spec stands here for every member. Not
    /// placed while any is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<(JobId, bool)>,
    /// When its last dependency ended, on the view's clock (Unix ms; 0: it had none): its wait
    /// for a placement, and its `relax_after_s` steps, count from here.
    #[serde(default)]
    pub ready_ms: u64,
    /// Its index within its array (`TESSERA_ARRAY_INDEX`); none when it was submitted alone.
    /// The array's first job is `id - index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_index: Option<u32>,
    /// The stop grace its cancel asked for, seconds (over its spec's `stop_grace_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_grace_s: Option<u64>,
    /// The trace its admission was recorded under (see [`crate::trace`]); none for a job
    /// admitted without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::JobTrace>,
}

impl Job {
    /// When it started waiting for a placement (Unix ms on the view's clock): its submission,
    /// or, when it waited for other jobs, the end of the last of them.
    pub fn waiting_from_ms(&self) -> u64 {
        self.times.submitted_ms.max(self.ready_ms)
    }

    /// The first job of its array, if it belongs to one.
    pub fn array_first(&self) -> Option<JobId> {
        self.array_index.and_then(|i| self.id.0.checked_sub(u64::from(i))).map(JobId)
    }

    /// Whether this job ranks above `other` for preemption: a higher priority, or the same
    /// priority and a lower attained-service queue.
    pub fn outranks(&self, other: &Job) -> bool {
        self.rank() > other.rank()
    }

    /// Its rank for preemption: priority, then the lower attained-service queue.
    pub fn rank(&self) -> (i32, std::cmp::Reverse<u8>) {
        (self.spec.priority, std::cmp::Reverse(self.service_queue))
    }

    /// Whether its placement has a member on `server`.
    pub fn placed_on(&self, server: crate::ids::ServerId) -> bool {
        self.placement.as_ref().is_some_and(|p| p.members.iter().any(|m| m.server == server))
    }

    /// When its current placement's time limit runs out (Unix ms): none without a placement,
    /// a limit, or a placement time (placed before the log carried clocks).
    pub fn deadline_ms(&self) -> Option<u64> {
        let limit = self.spec.run.time_limit_s?;
        (self.placement.is_some() && self.times.placed_ms > 0)
            .then(|| self.times.placed_ms.saturating_add(limit.saturating_mul(1000)))
    }

    /// GPUs and CPU cores its current placement holds (0, 0 without one).
    pub fn holding(&self) -> (u32, u32) {
        self.placement.as_ref().map_or((0, 0), |p| {
            (p.members.iter().map(|m| m.gpus.count_ones()).sum(), p.members.iter().map(|m| m.cores.count()).sum())
        })
    }

    /// Its usage within `[from_ms, to_ms)`: the spans it held, and the placement it holds now
    /// up to `now_ms`.
    pub fn usage_within(&self, from_ms: u64, to_ms: u64, now_ms: u64) -> crate::usage::Usage {
        let mut u = crate::usage::Usage::default();
        for s in &self.held {
            u.add(s.usage_within(from_ms, to_ms));
        }
        if let Some(s) = self.holding_span(now_ms) {
            u.add(s.usage_within(from_ms, to_ms));
        }
        u
    }

    /// The span of the placement it holds, up to `now_ms` (none without a placement, or when
    /// it was placed before the log carried clocks).
    pub fn holding_span(&self, now_ms: u64) -> Option<crate::usage::HeldSpan> {
        let (gpus, cores) = self.holding();
        (self.placement.is_some() && self.times.placed_ms > 0).then(|| crate::usage::HeldSpan {
            from_ms: self.times.placed_ms,
            to_ms: now_ms.max(self.times.placed_ms),
            gpus,
            cores,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_name_parses_and_is_bounded() {
        let parse = |extra: &str| JobSpec::from_toml("j.toml", &format!("name='j'\ngpus=1\n{extra}\n"));
        assert_eq!(parse("model = 'ResNet-50'").expect("valid").model.as_deref(), Some("ResNet-50"));
        assert_eq!(parse("").expect("valid").model, None);
        let long = "m".repeat(MAX_MODEL_LEN + 1);
        for bad in ["model = ' '", "model = \"a\\u0007b\"", &format!("model = '{long}'")] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.contains("model") && e.contains("control characters"), "{bad}: {e}");
        }
    }

    #[test]
    fn dependencies_and_arrays_parse_and_are_bounded() {
        let parse = |extra: &str| JobSpec::from_toml("j.toml", &format!("name='j'\ngpus=1\n{extra}\n"));
        let s = parse("after = [3, 4]\nafter_any = [5]\narray = 8").expect("valid");
        assert_eq!((s.after, s.after_any, s.array), (vec![JobId(3), JobId(4)], vec![JobId(5)], Some(8)));
        let err = |extra: &str| parse(extra).expect_err(extra).to_string();
        assert!(err("after = [3, 3]").contains("job-3 is named twice"));
        assert!(err("after = [3]\nafter_any = [3]").contains("named twice"));
        assert!(err("after = [0]").contains("start at 1"));
        assert!(err("array = 0").contains("array"));
        assert!(err("array = 1001").contains("1..=1000"));
        let many: Vec<String> = (1..=65).map(|i| i.to_string()).collect();
        assert!(err(&format!("after = [{}]", many.join(","))).contains("at most 64"));
        assert!(err("after = [-1]").contains("after"), "not an id");
    }

    #[test]
    fn a_priority_is_a_number_or_a_class_name() {
        let parse = |p: &str| JobSpec::from_toml("j.toml", &format!("name='j'\ngpus=1\npriority={p}\n"));
        let n = parse("-5").expect("a number");
        assert_eq!((n.priority, n.class), (-5, None));
        let c = parse("'batch'").expect("a class");
        assert_eq!((c.priority, c.class.as_deref()), (0, Some("batch")), "resolved at admission, not here");
        let e = parse("1.5").expect_err("not whole").to_string();
        assert!(e.contains("a whole number") && e.contains("priority class"), "{e}");
        let e = parse("9999999999").expect_err("out of range").to_string();
        assert!(e.contains("out of range"), "{e}");
        let e = parse("'two words'").expect_err("spaces").to_string();
        assert!(e.contains("not a class name"), "{e}");
    }

    #[test]
    fn levels_declared_free_of_slowdown_are_allowed_at_once_and_the_timer_relaxes_the_rest() {
        let mut s = JobSpec::simple("j", 1, 2);
        (s.prefer, s.tolerate, s.relax_after_s) = (LocalityLevel::PcieSwitch, LocalityLevel::Rack, Some(600));
        assert_eq!(s.allowed_level(0), LocalityLevel::PcieSwitch, "nothing declared: the timer alone");
        assert_eq!(s.allowed_level(600), LocalityLevel::Socket);
        s.slowdown.insert(LocalityLevel::Socket, 0.0);
        s.slowdown.insert(LocalityLevel::Server, 0.1);
        assert_eq!(s.allowed_level(0), LocalityLevel::Socket, "a free socket at once");
        assert_eq!(s.allowed_level(1200), LocalityLevel::Server, "a lossy server only by the timer");
        // A gap stops the free run: rack is free but server is not.
        s.slowdown.insert(LocalityLevel::Rack, 0.0);
        assert_eq!(s.allowed_level(0), LocalityLevel::Socket);
        // All free: everything up to `tolerate` at once, and never beyond it.
        s.slowdown = LocalityLevel::ALL.iter().map(|l| (*l, 0.0)).collect();
        assert_eq!(s.allowed_level(0), LocalityLevel::Rack);
        // No timer: `tolerate` at once, as before.
        s.relax_after_s = None;
        s.slowdown.clear();
        assert_eq!(s.allowed_level(0), LocalityLevel::Rack);
    }

    #[test]
    fn run_settings_parse_and_bad_ones_name_the_field() {
        let j = JobSpec::from_toml(
            "j.toml",
            "name='r'\ngpus=1\nenv={NCCL_DEBUG='INFO', _X1='a b'}\nworkdir='/data/r'\ntime_limit_s=3600\n",
        )
        .expect("valid");
        assert_eq!(j.run.env.get("NCCL_DEBUG").map(String::as_str), Some("INFO"));
        assert_eq!((j.run.workdir.as_deref(), j.run.time_limit_s), (Some("/data/r"), Some(3600)));
        assert!(err("name='r'\ngpus=1\nenv={RANK='3'}\n").contains("env.RANK"));
        assert!(err("name='r'\ngpus=1\nenv={TESSERA_JOB_ID='3'}\n").contains("set by the node agent"));
        assert!(err("name='r'\ngpus=1\nenv={'1X'='3'}\n").contains("not a variable name"));
        assert!(err("name='r'\ngpus=1\nworkdir='data'\n").contains("absolute path"));
        assert!(err("name='r'\ngpus=1\ntime_limit_s=0\n").contains("time_limit_s"));
        let j = JobSpec::from_toml("j.toml", "name='r'\ngpus=1\nrestart={max=3}\nstop_grace_s=30\n").expect("valid");
        assert_eq!(j.run.restart, Some(RestartPolicy { max: 3, backoff_s: DEFAULT_RESTART_BACKOFF_S }));
        assert_eq!(j.run.stop_grace_s, Some(30));
        let j = JobSpec::from_toml("j.toml", "name='r'\ngpus=1\n[restart]\nmax=1\nbackoff_s=0\n").expect("valid");
        assert_eq!(j.run.restart, Some(RestartPolicy { max: 1, backoff_s: 0 }));
        assert!(err("name='r'\ngpus=1\nrestart={max=0}\n").contains("restart.max"));
        assert!(err("name='r'\ngpus=1\nrestart={max=101}\n").contains("restart.max"));
        assert!(err("name='r'\ngpus=1\nrestart={max=2, backoff_s=3601}\n").contains("restart.backoff_s"));
        assert!(err("name='r'\ngpus=1\nrestart={max=2, on='always'}\n").contains("on"));
        assert!(err("name='r'\ngpus=1\nstop_grace_s=3601\n").contains("stop_grace_s"));
        let big: String = (0..129).map(|i| format!("V{i}='x',")).collect();
        assert!(err(&format!("name='r'\ngpus=1\nenv={{{}}}\n", big.trim_end_matches(','))).contains("at most 128"));
    }

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

    #[test]
    fn parse_only_checks_stay_in_the_parser() {
        let e = err("name='r'\ngpus=4\nmembers=0\n");
        assert!(e.contains("field `members`"), "{e}");
        let e = err("name='r'\ngpus_per_member=2\nmembers=0\ngpus=4\n");
        assert!(e.contains("field `members`"), "{e}");
        let e = err("name='r'\ngpus=4\nmembers=2\ngpus_per_member=2147483648\n");
        assert!(e.contains("field `gpus`"), "{e}");
        let e = err("name='r'\ngpus=1\n[cpu]\ncores_per_gpu=2\nmin_cores_per_gpu=1\n");
        assert!(e.contains("cpu.min_cores_per_gpu") && e.contains("only applies"), "{e}");
        let e = err("name='r'\ngpus=1\n[cpu]\npredictor={p0=1.0,p1=0.0,p2=1.0,theta=3.0}\nmin_cores_per_gpu=4\n");
        assert!(e.contains("cpu.min_cores_per_gpu") && e.contains("1..=3"), "{e}");
        let e = err("name='r'\ngpus=1\n[cpu]\npredictor={p0=nan,p1=0.0,p2=1.0,theta=3.0}\n");
        assert!(e.contains("cpu.predictor.p0"), "{e}");
        let e = err("name='r'\ngpus=1\n[locality]\nrelax_after_s=0\n");
        assert!(e.contains("locality.relax_after_s"), "{e}");
    }

    #[test]
    fn built_specs_are_validated_like_files() {
        let ok = JobSpec::simple("r", 2, 4);
        assert_eq!(ok.validate(), Ok(()));
        let broken = |f: &dyn Fn(&mut JobSpec)| {
            let mut s = ok.clone();
            f(&mut s);
            s.validate().expect_err("must be refused")
        };
        let e = broken(&|s| (s.prefer, s.tolerate) = (LocalityLevel::Rack, LocalityLevel::Server));
        assert_eq!(e.field, "locality.tolerate");
        assert!(e.message.contains("tighter"), "{e}");
        assert_eq!(broken(&|s| s.gpus_per_member = 0).field, "gpus_per_member");
        assert_eq!(broken(&|s| s.members = MAX_MEMBERS + 1).field, "members");
        assert_eq!(broken(&|s| s.cpu = CpuDemand::Fixed { cores_per_gpu: 129 }).field, "cpu.cores_per_gpu");
        let p = Predictor { p0: 1.0, p1: 0.0, p2: 1.0, theta: f64::INFINITY };
        let e = broken(&|s| s.cpu = CpuDemand::Predicted { predictor: p, min_cores_per_gpu: 1 });
        assert_eq!(e.field, "cpu.predictor.theta");
        assert_eq!(broken(&|s| s.command = vec![" ".into()]).field, "command");
        assert_eq!(
            broken(&|s| s.slowdown.insert(LocalityLevel::Rack, -0.1).map(drop).unwrap_or(())).field,
            "locality.slowdown.rack"
        );
        assert_eq!(
            Predictor { p0: 0.0, p1: 0.0, p2: 0.0, theta: 0.5 }.validate().map_err(|e| e.field),
            Err("theta".into())
        );
    }
}
