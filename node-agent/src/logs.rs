//! The agent's own gRPC service (`tessera.v1.Agent`): task logs for `tessera logs` and the HTTP
//! API. The agent announces where it serves in its registration and heartbeats; the leader
//! tells clients (`Agents`), who then ask the agent directly, as `kubectl logs` asks the kubelet.
//!
//! With TLS, callers are the replicas (the HTTP API asks after checking the job's tenant),
//! admins and scheduler hosts; a user reads logs through the HTTP API (`GET
//! /v1/jobs/{id}/logs`), which knows whose job it is. Others are refused (`PERMISSION_DENIED`).

use std::path::{Path, PathBuf};
use tessera_proto::tls::{Role, Security};
use tessera_proto::v1;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tonic::{Request, Response, Status};

/// Bytes returned when the request names no tail length.
pub const DEFAULT_TAIL: u64 = 64 * 1024;
/// Most bytes returned by one call.
pub const MAX_TAIL: u64 = 4 * 1024 * 1024;

/// Serves the logs of the task directories under `tasks_dir`.
#[derive(Debug, Clone)]
pub struct LogService {
    tasks_dir: PathBuf,
    security: Security,
}

impl LogService {
    /// The service over `<state dir>/tasks`, authenticating callers with `security`.
    pub fn new(tasks_dir: PathBuf, security: Security) -> LogService {
        LogService { tasks_dir, security }
    }
}

/// The directory of the newest placement of `job`'s member `member` (task directories are
/// named `j<job>-p<proposal>-m<member>`; a job re-placed after a failure has several).
fn newest_task_dir(tasks_dir: &Path, job: u64, member: u32) -> std::io::Result<Option<PathBuf>> {
    let prefix = format!("j{job}-p");
    let suffix = format!("-m{member}");
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(tasks_dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(&prefix) && name.ends_with(&suffix)) {
            continue;
        }
        let modified = e.metadata()?.modified()?;
        if best.as_ref().is_none_or(|(t, _)| modified > *t) {
            best = Some((modified, e.path()));
        }
    }
    Ok(best.map(|(_, p)| p))
}

#[tonic::async_trait]
impl v1::agent_server::Agent for LogService {
    async fn logs(&self, req: Request<v1::LogsRequest>) -> Result<Response<v1::LogsResponse>, Status> {
        let who = tessera_proto::tls::caller_of(&self.security, &req).map_err(|e| {
            tracing::warn!(target: "tessera::audit", error = %e, "Agent.Logs refused");
            Status::unauthenticated(e.to_string())
        })?;
        if !matches!(who.role, Role::Replica | Role::Admin | Role::Scheduler) {
            tracing::warn!(target: "tessera::audit", who = %who, "Agent.Logs refused");
            return Err(Status::permission_denied(format!(
                "{who} may not read task logs from the agent (users read them through the HTTP API)"
            )));
        }
        let r = req.into_inner();
        let tail = match r.tail_bytes {
            0 => DEFAULT_TAIL,
            n if n > MAX_TAIL => {
                return Err(Status::invalid_argument(format!("tail_bytes {n}: at most {MAX_TAIL}")));
            }
            n => n,
        };
        let dir = newest_task_dir(&self.tasks_dir, r.job, r.member)
            .map_err(|e| Status::internal(format!("reading {}: {e}", self.tasks_dir.display())))?
            .ok_or_else(|| {
                Status::not_found(format!("no task of job {} member {} ran on this server", r.job, r.member))
            })?;
        let path = dir.join(if r.stderr { "stderr.log" } else { "stdout.log" });
        let mut f = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Response::new(v1::LogsResponse { path: path.display().to_string(), ..Default::default() }));
            }
            Err(e) => return Err(Status::internal(format!("{}: {e}", path.display()))),
        };
        let size = f.metadata().await.map_err(|e| Status::internal(format!("{}: {e}", path.display())))?.len();
        let start = size.saturating_sub(tail);
        f.seek(std::io::SeekFrom::Start(start)).await.map_err(|e| Status::internal(e.to_string()))?;
        let mut data = Vec::with_capacity((size - start) as usize);
        // Bounded: a task still writing must not make the read grow past the tail asked for.
        f.take(tail).read_to_end(&mut data).await.map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(v1::LogsResponse { data, size, truncated: start > 0, path: path.display().to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::agent_server::Agent;

    #[tokio::test]
    async fn serves_the_newest_placements_tail() {
        let tmp = tempfile::tempdir().expect("tmp");
        let old = tmp.path().join("j7-p1-m0");
        let new = tmp.path().join("j7-p2-m0");
        std::fs::create_dir_all(&old).expect("dir");
        std::fs::write(old.join("stdout.log"), "old\n").expect("write");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::create_dir_all(&new).expect("dir");
        std::fs::write(new.join("stdout.log"), "0123456789").expect("write");
        let s = LogService::new(tmp.path().to_path_buf(), Security::Insecure);
        let r = s
            .logs(Request::new(v1::LogsRequest { job: 7, member: 0, stderr: false, tail_bytes: 4 }))
            .await
            .expect("logs")
            .into_inner();
        assert_eq!((r.data.as_slice(), r.size, r.truncated), (&b"6789"[..], 10, true));
        let e = s
            .logs(Request::new(v1::LogsRequest { job: 8, member: 0, stderr: false, tail_bytes: 0 }))
            .await
            .expect_err("no such task");
        assert_eq!(e.code(), tonic::Code::NotFound);
    }
}
