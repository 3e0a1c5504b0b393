//! The agent process's errors.

/// The agent's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Setup(#[from] custody_kube::Error),
    #[error("the gate's certificate: {0}")]
    GateCertificate(String),
    #[error("serving the gate on {address}: {source}")]
    ServeGate {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("listening for the gate on {address}: {source}")]
    ListenGate {
        address: String,
        #[source]
        source: std::io::Error,
    },
}
