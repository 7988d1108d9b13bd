//! With the `peers` feature, compiles the small subset of etcd's API the
//! benchmark drives (lease grant, lock, unlock), with a pure-Rust compiler.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "peers")]
    {
        use prost::Message;
        let protos = ["proto/etcd.proto", "proto/v3lock.proto"];
        println!("cargo:rerun-if-changed=proto");
        let descriptors = protox::compile(protos, ["proto"])?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("etcd_descriptor.bin");
        std::fs::write(&out, descriptors.encode_to_vec())?;
        tonic_prost_build::configure()
            .build_server(false)
            .skip_protoc_run()
            .file_descriptor_set_path(&out)
            .compile_protos(&protos, &["proto"])?;
    }
    Ok(())
}
