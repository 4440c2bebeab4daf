//! Compiles the SLM and plugin-registration protos with the vendored protoc from
//! `protoc-bin-vendored`, so neither developers nor CI need a system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_with_config(
            config,
            &["proto/slm.proto", "proto/pluginregistration.proto"],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
