//! Compiles `proto/tessera/v1/*.proto` into Rust: messages with prost-build, gRPC services
//! with tonic-prost-build.
//!
//! `protoc` comes from the `PROTOC` environment variable when it is set, and otherwise from the
//! vendored binary of `protoc-bin-vendored`, so a build needs no system protobuf install.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const PROTOS: &[&str] = &["proto/tessera/v1/view.proto", "proto/tessera/v1/service.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = prost_build::Config::new();
    // `Config::new` already honours `PROTOC`; fall back to the vendored binary otherwise.
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    // Deterministic order (and encoding) for map fields such as the tenant quotas.
    config.btree_map(["."]);
    // Messages with prost, services (client and server stubs) with tonic.
    tonic_prost_build::configure().compile_with_config(config, PROTOS, &[PROTO_ROOT])?;
    Ok(())
}
