//! The controller crate's error type. Variant names double as metric labels and Event reasons.

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("loading Kubernetes client configuration: {0}")]
    LoadClientConfig(String),
    /// The API server did not answer the start-up check.
    #[error("reaching the API server: {0}")]
    ReachApiServer(#[source] kube::Error),
    /// A status patch was refused.
    #[error("patching status of {object}: {source}")]
    PatchStatus {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// An Event could not be published.
    #[error("publishing event on {object}: {source}")]
    PublishEvent {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The shared set-up (client, HTTP endpoint) failed.
    #[error(transparent)]
    Setup(#[from] custody_kube::Error),
    /// The agent-report service could not be served.
    #[error("serving agent reports on {address}: {message}")]
    ServeReports { address: String, message: String },
    /// An object could not be read.
    #[error("reading {object}: {source}")]
    Read {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// An object could not be created.
    #[error("creating {object}: {source}")]
    Create {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// An object could not be deleted.
    #[error("deleting {object}: {source}")]
    Delete {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The API server dropped a field custody wrote: its CRD is older than the controller.
    #[error(
        "the API server dropped {field} of {object}: the CRD is older than this controller; apply deploy/crds (helm upgrade does not update CRDs)"
    )]
    OutdatedSchema { object: String, field: String },
    /// An object could not be patched.
    #[error("patching {object}: {source}")]
    Patch {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The admission webhook could not be served or its certificate managed.
    #[error("admission webhook: {0}")]
    Webhook(String),
    /// custody's CA or a certificate it issues could not be made or stored.
    #[error("certificates: {0}")]
    Certificates(String),
    /// This replica stopped leading (it could not renew its Lease, or another holds it).
    #[error("leadership lost: {0}")]
    LeadershipLost(String),
    /// A schedule could not be evaluated.
    #[error("evaluating the schedule: {0}")]
    Schedule(String),
    /// CRD YAML could not be written.
    #[error("writing CRDs: {0}")]
    WriteCrds(String),
}

impl Error {
    /// A failed read of `object`, for `map_err`.
    pub fn read(object: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let object = object.into();
        move |source| Error::Read { object, source }
    }

    /// The variant name, as a metric label and Event reason.
    pub fn label(&self) -> &'static str {
        match self {
            Error::LoadClientConfig(_) => "LoadClientConfig",
            Error::ReachApiServer(_) => "ReachApiServer",
            Error::PatchStatus { .. } => "PatchStatus",
            Error::PublishEvent { .. } => "PublishEvent",
            Error::Setup(error) => error.label(),
            Error::ServeReports { .. } => "ServeReports",
            Error::Read { .. } => "Read",
            Error::Create { .. } => "Create",
            Error::Delete { .. } => "Delete",
            Error::Patch { .. } => "Patch",
            Error::Webhook(_) => "Webhook",
            Error::Certificates(_) => "Certificates",
            Error::LeadershipLost(_) => "LeadershipLost",
            Error::Schedule(_) => "Schedule",
            Error::WriteCrds(_) => "WriteCrds",
            Error::OutdatedSchema { .. } => "OutdatedSchema",
        }
    }
}

/// Result with the controller's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
