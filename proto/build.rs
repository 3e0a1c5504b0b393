//! Generates the gRPC code for both services from `proto/custody/*.proto` (protoc from
//! Debian's `protobuf-compiler`, or `$PROTOC`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &["proto/custody/gate.proto", "proto/custody/report.proto"],
        &["proto"],
    )?;
    Ok(())
}
