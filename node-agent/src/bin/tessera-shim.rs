//! The task shim as a program of its own: runs [`shim_main`] for the task directory that
//! `TESSERA_SHIM_DIR` names, as `tessera agent shim` does in the agent binary. The task
//! runner's process tests (`tests/task.rs`) start their tasks under it.

use std::path::Path;
use std::process::ExitCode;
use tessera_agent::task::{SHIM_DIR_ENV, shim_main};

fn main() -> ExitCode {
    let Some(dir) = std::env::var_os(SHIM_DIR_ENV) else {
        eprintln!("tessera-shim is started by the task runner, with {SHIM_DIR_ENV} set");
        return ExitCode::from(2);
    };
    ExitCode::from(u8::try_from(shim_main(Path::new(&dir))).unwrap_or(1))
}
