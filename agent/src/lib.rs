//! custody's node side: finding a pod's volumes on the node, building and verifying
//! manifests of their content, and (in the binaries) the agent, `custody-wait` and
//! `custody-mover`.

pub mod allocator;
pub mod certificate;
pub mod cli;
pub mod daemon;
pub mod error;
pub mod freeze;
pub mod gate;
pub mod hashing;
pub mod manifest_builder;
pub mod metrics;
pub mod mover;
pub mod movers;
pub mod node;
pub mod report;
pub mod state;
pub mod tree;
pub mod upstream;
pub mod verification;
pub mod verify;
pub mod volume_state;
pub mod volumes;
pub mod wait;
