//! Compiles the .proto with a pure-Rust protobuf compiler, so no `protoc`
//! is needed on the build machine.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/baton/v1/baton.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("baton_descriptor.bin");
    std::fs::write(&out, descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .skip_protoc_run()
        .codec_path("crate::codec::BatonCodec")
        .file_descriptor_set_path(&out)
        .compile_protos(&[proto], &["proto"])?;
    // The server's side again, on the same message types, except that a
    // Watch answer is handed over already encoded (`crate::wire`).
    let server = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("server");
    std::fs::create_dir_all(&server)?;
    tonic_prost_build::configure()
        .skip_protoc_run()
        .build_client(false)
        .codec_path("crate::codec::BatonCodec")
        .extern_path(
            ".baton.v1.WatchResponse",
            "crate::wire::EncodedWatchResponse",
        )
        .extern_path(".baton.v1", "crate::v1")
        .file_descriptor_set_path(&out)
        .out_dir(&server)
        .compile_protos(&[proto], &["proto"])?;
    Ok(())
}
