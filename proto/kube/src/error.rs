//! Errors of the shared set-up. Variant names double as metric labels.

/// What can go wrong while setting a process up or serving its endpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("loading Kubernetes client configuration: {0}")]
    LoadClientConfig(String),
    /// The metrics and health endpoint could not be served.
    #[error("serving HTTP on {address}: {source}")]
    ServeHttp {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The variant name, as a metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Error::LoadClientConfig(_) => "LoadClientConfig",
            Error::ServeHttp { .. } => "ServeHttp",
        }
    }
}

/// Result with the shared [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
