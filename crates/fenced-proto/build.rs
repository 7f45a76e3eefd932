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
    // Every routed method, `package.Service/Method`, sorted: the only names
    // the server's `/metrics` puts in a label (a caller's path never is).
    let mut methods: Vec<String> = descriptors
        .file
        .iter()
        .flat_map(|f| {
            f.service.iter().flat_map(move |s| {
                s.method
                    .iter()
                    .map(move |m| format!("{}.{}/{}", f.package(), s.name(), m.name()))
            })
        })
        .collect();
    methods.sort();
    let list: String = methods.iter().map(|m| format!("    {m:?},\n")).collect();
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("methods.rs");
    std::fs::write(out, format!("pub const METHODS: &[&str] = &[\n{list}];\n"))?;
    // The whole contract, for gRPC server reflection (grpcurl and other
    // tools call fenced with no .proto files at hand).
    let fds = PathBuf::from(std::env::var("OUT_DIR")?).join("fenced_descriptor.bin");
    let encoded = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(fds, &encoded)?;
    // The proto3 JSON mapping (lowerCamelCase names, 64-bit integers as
    // strings, enums by name, unknown fields refused) for the JSON API.
    if std::env::var_os("CARGO_FEATURE_JSON").is_some() {
        pbjson_build::Builder::new()
            .register_descriptors(&encoded)?
            .build(&[".fenced.v1"])?;
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
