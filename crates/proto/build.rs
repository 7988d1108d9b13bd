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
    Ok(())
}
