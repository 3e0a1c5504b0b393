//! What custody's control plane (`custody-controller`) and node side (`custody-agent`,
//! `custody-mover`) share on the Kubernetes side, so that neither depends on the other: the
//! custody.io/v1alpha1 API types, the client and process set-up (kubeconfig, signals,
//! tracing), the `/metrics` `/healthz` `/readyz` endpoint, TokenReview, and S3 clients for a
//! BackupRepository.
//!
//! Kube-free contracts (wire formats, names, reasons, the on-volume layout) live in
//! [`custody_proto`]; this crate adds what needs a Kubernetes or S3 client.

pub mod api;
pub mod authn;
pub mod error;
pub mod grpc;
pub mod http;
pub mod process;
pub mod s3;
pub mod sts;
pub mod tls;

pub use error::{Error, Result};
