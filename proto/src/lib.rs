//! Wire contracts and kube-free types shared by the controller and the node agent.
//!
//! Nothing here talks to Kubernetes: it is plain data and the arithmetic both ends of a
//! connection must agree on.

pub mod authn;
pub mod clock;
pub mod manifest;
pub mod mover;
pub mod names;
pub mod progress;
pub mod reasons;
pub mod s3_limits;
pub mod volume;

/// The generated gRPC code, nested by protobuf package so that cross-package references
/// resolve.
#[allow(clippy::all, missing_docs)]
mod generated {
    pub mod custody {
        pub mod gate {
            pub mod v1 {
                tonic::include_proto!("custody.gate.v1");
            }
        }
        pub mod report {
            pub mod v1 {
                tonic::include_proto!("custody.report.v1");
            }
        }
    }
}

/// The pod gate service (`custody.gate.v1`), from `proto/custody/gate.proto`.
pub use generated::custody::gate::v1 as gate;
/// The agent-report service (`custody.report.v1`), from `proto/custody/report.proto`.
pub use generated::custody::report::v1 as report;
