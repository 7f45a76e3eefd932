//! Compiles proto/fenced/v1 with protox (a protobuf compiler in Rust), so a
//! fresh machine needs no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "lock.proto",
        "cluster.proto",
        "resource.proto",
        "kv.proto",
        "maintenance.proto",
    ]
    .map(|f| root.join("fenced/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
