//! Command-line interface of `custody-controller`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use custody_kube::process::LogFormat;

/// custody's controller.
#[derive(Debug, Parser)]
#[command(name = "custody-controller", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the reconcilers and serve /metrics, /healthz and /readyz.
    Run(Box<RunOptions>),
    /// Let go of everything custody holds before it is removed: delete its webhook
    /// configurations, stop the controller, remove custody's finalizers (and no others).
    Uninstall(Box<crate::uninstall::UninstallOptions>),
    /// Print the CustomResourceDefinitions of every custody kind as YAML.
    Crds {
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// Options of `custody-controller run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOptions {
    /// Kubeconfig to use; without it, $KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Watch namespaced custody objects in this namespace only (default: every namespace).
    /// Nodes are then marked silent only when their agent reported to this process.
    #[arg(long, env = "CUSTODY_NAMESPACE")]
    pub namespace: Option<String>,

    /// Namespace of custody's own Leases (one per Cluster while a backup or restore runs into
    /// it). Default: `--namespace` when set, else the controller's own namespace
    /// ($POD_NAMESPACE), else `custody-system`.
    #[arg(long, env = "CUSTODY_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Address of the /metrics, /healthz and /readyz endpoints.
    #[arg(long, env = "CUSTODY_HTTP_ADDRESS", default_value = "0.0.0.0:8080")]
    pub http_address: SocketAddr,

    /// Log line format.
    #[arg(long, env = "CUSTODY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Instance name in published Events (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,

    /// Address of the agent-report gRPC service.
    #[arg(long, env = "CUSTODY_REPORT_ADDRESS", default_value = "0.0.0.0:9444")]
    pub report_address: SocketAddr,

    /// PEM certificate of the agent-report service; plain HTTP/2 without it.
    #[arg(long, env = "CUSTODY_REPORT_TLS_CERT", requires = "report_tls_key")]
    pub report_tls_cert: Option<PathBuf>,

    /// PEM private key of the agent-report service's certificate.
    #[arg(long, env = "CUSTODY_REPORT_TLS_KEY", requires = "report_tls_cert")]
    pub report_tls_key: Option<PathBuf>,

    /// The agents' ServiceAccount, `namespace:name`: only its tokens may report.
    #[arg(
        long,
        env = "CUSTODY_AGENT_SERVICE_ACCOUNT",
        default_value = "custody-system:custody-agent"
    )]
    pub agent_service_account: String,

    /// Image of `custody-mover`, run by backup and restore Jobs (the agent's image carries it).
    #[arg(long, env = "CUSTODY_MOVER_IMAGE", default_value = concat!("ghcr.io/custody/custody-agent:", env!("CARGO_PKG_VERSION")))]
    pub mover_image: String,

    /// Hard bound, in seconds, on how long a backup or prepareData Job may run (its
    /// `activeDeadlineSeconds`, from its start, pending pods included): past it the Backup or
    /// Restore fails with the Job's reason and gives the Cluster back.
    #[arg(long, env = "CUSTODY_JOB_DEADLINE_SECONDS", default_value_t = crate::mover_job::DEFAULT_DEADLINE_SECONDS)]
    pub job_deadline_seconds: i64,

    /// CPU request of the mover's container (and of a backup command's).
    #[arg(long, env = "CUSTODY_MOVER_CPU_REQUEST", default_value = crate::mover_job::DEFAULT_CPU_REQUEST)]
    pub mover_cpu_request: String,

    /// Memory request of the mover's container (and of a backup command's).
    #[arg(long, env = "CUSTODY_MOVER_MEMORY_REQUEST", default_value = crate::mover_job::DEFAULT_MEMORY_REQUEST)]
    pub mover_memory_request: String,

    /// Memory limit of the mover's container (and of a backup command's).
    #[arg(long, env = "CUSTODY_MOVER_MEMORY_LIMIT", default_value = crate::mover_job::DEFAULT_MEMORY_LIMIT)]
    pub mover_memory_limit: String,

    /// How many times a prepareData Job replaces a pod that failed for a reason of the moment
    /// (a download that kept failing, a signal, a crash); 0 never. A failure that trying again
    /// cannot mend (a tampered artifact, a non-empty target) fails the Job at once.
    #[arg(long, env = "CUSTODY_RESTORE_JOB_RETRIES", default_value_t = crate::mover_job::DEFAULT_RESTORE_RETRIES)]
    pub restore_job_retries: i32,

    /// The most of custody's movers (backup and prepareData Jobs) that run on one node at
    /// once; a Backup or a restoring volume past it waits (`MoverSlotsBusy`) until one ends.
    /// 0: no bound.
    #[arg(long, env = "CUSTODY_MOVERS_PER_NODE", default_value_t = 0)]
    pub movers_per_node: u32,

    /// A running backup or restoring volume whose mover reports no more bytes or files
    /// copied for this long gets the condition `Stalled` (True, `NoProgress`, naming the
    /// volume and the node) and a Warning Event; it turns False when the copy moves again.
    #[arg(long, env = "CUSTODY_STALLED_AFTER_SECONDS", default_value_t = crate::transfer::DEFAULT_STALLED_AFTER_SECONDS, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub stalled_after_seconds: u64,

    /// Image of `custody-wait`, the init container the webhook injects into pods under restore.
    #[arg(long, env = "CUSTODY_WAIT_IMAGE", default_value = concat!("ghcr.io/custody/custody-agent:", env!("CARGO_PKG_VERSION")))]
    pub wait_image: String,

    /// PEM CA that signed the agents' gate certificates; published to namespaces under restore
    /// (ConfigMap `custody-gate-ca`) so that `custody-wait` can check its agent.
    #[arg(long, env = "CUSTODY_GATE_CA_FILE")]
    pub gate_ca_file: Option<PathBuf>,

    /// Address of the admission webhook (HTTPS); no webhook without it.
    #[arg(long, env = "CUSTODY_WEBHOOK_ADDRESS")]
    pub webhook_address: Option<SocketAddr>,

    /// The MutatingWebhookConfiguration whose `caBundle` the controller keeps current.
    #[arg(
        long,
        env = "CUSTODY_WEBHOOK_CONFIGURATION",
        default_value = "custody-restore-gate"
    )]
    pub webhook_configuration: String,

    /// The ValidatingWebhookConfiguration (custody's own kinds, checked against what their
    /// writer may do) whose `caBundle` the controller keeps current.
    #[arg(
        long,
        env = "CUSTODY_VALIDATING_WEBHOOK_CONFIGURATION",
        default_value = "custody-requester-check"
    )]
    pub validating_webhook_configuration: String,

    /// Secret, `namespace/name`, holding the webhook's CA and serving certificate (generated
    /// and rotated by the controller, shared by its replicas).
    #[arg(
        long,
        env = "CUSTODY_WEBHOOK_SECRET",
        default_value = "custody-system/custody-webhook-tls"
    )]
    pub webhook_secret: String,

    /// Names the serving certificate carries (DNS names or IP addresses), comma-separated.
    #[arg(
        long,
        env = "CUSTODY_WEBHOOK_NAMES",
        value_delimiter = ',',
        default_value = "custody-controller.custody-system.svc"
    )]
    pub webhook_names: Vec<String>,

    /// Lifetime of a serving certificate, in days; renewed when a third of it is left.
    #[arg(long, env = "CUSTODY_WEBHOOK_CERT_DAYS", default_value = "90")]
    pub webhook_cert_days: u32,

    /// How often each replica re-reads the webhook's certificate Secret and renews it when due.
    #[arg(long, env = "CUSTODY_WEBHOOK_CHECK_SECONDS", default_value = "3600")]
    pub webhook_check_seconds: u64,

    /// Leader election: the Lease (in the Lease namespace) whose holder runs the reconcilers;
    /// every replica serves the webhook and the report service. Without it this process
    /// always reconciles (one replica only).
    #[arg(long, env = "CUSTODY_LEADER_ELECTION_LEASE")]
    pub leader_election_lease: Option<String>,

    /// Seconds a leader that stopped renewing keeps others from taking over (renewed every
    /// third of it).
    #[arg(long, env = "CUSTODY_LEADER_ELECTION_SECONDS", default_value = "15")]
    pub leader_election_seconds: u64,

    /// Secret, `namespace/name`, holding custody's CA, which the controller makes and rotates
    /// itself: it signs the report service's certificate and each node's gate certificate
    /// (asked for by the node's agent), and its trust bundle is published as ConfigMap
    /// `custody-ca` (key `ca.crt`) in the Secret's namespace and, for `custody-wait` and movers,
    /// as `custody-gate-ca` in namespaces under restore. Without it the certificates come from
    /// files (`--report-tls-cert`, `--gate-ca-file`: cert-manager or hand-made).
    #[arg(long, env = "CUSTODY_CA_SECRET")]
    pub ca_secret: Option<String>,

    /// Names the report service's certificate carries (issued from `--ca-secret`).
    #[arg(
        long,
        env = "CUSTODY_REPORT_NAMES",
        value_delimiter = ',',
        default_value = "custody-controller.custody-system.svc"
    )]
    pub report_names: Vec<String>,

    /// Lifetime of the certificates `--ca-secret` issues (report service, gates), in hours;
    /// each is renewed when a third of it is left.
    #[arg(long, env = "CUSTODY_CERTIFICATE_HOURS", default_value = "168")]
    pub certificate_hours: u32,

    /// Seconds a new CA is trusted (in every bundle) before it signs: time for the bundle to
    /// reach every mounted copy (the kubelet refreshes a mounted ConfigMap within about a
    /// minute and a half).
    #[arg(long, env = "CUSTODY_CA_PROPAGATION_SECONDS", default_value = "300")]
    pub ca_propagation_seconds: u64,

    /// How often each replica re-reads the CA Secret and renews what is due.
    #[arg(long, env = "CUSTODY_CA_CHECK_SECONDS", default_value = "10")]
    pub ca_check_seconds: u64,

    /// Seconds a namespace stays marked as under restore (`custody.io/restore-in-progress`,
    /// which scopes the restore gate) after its last mark once no restore is left in it.
    #[arg(long, env = "CUSTODY_RESTORE_MARK_GRACE_SECONDS", default_value = "60")]
    pub restore_mark_grace_seconds: u64,

    /// Seconds without a report after which a node's NodeAgent turns `Ready=False`.
    #[arg(long, env = "CUSTODY_AGENT_TIMEOUT_SECONDS", default_value = "40")]
    pub agent_timeout_seconds: u64,
}

impl RunOptions {
    /// Where custody's Leases live (see `--lease-namespace`).
    pub fn lease_namespace(&self) -> String {
        lease_namespace(
            self.lease_namespace.as_deref(),
            self.namespace.as_deref(),
            std::env::var("POD_NAMESPACE").ok().as_deref(),
        )
    }
}

/// The first of the flag, the one namespace watched and the controller's own namespace that
/// is set and not empty; else `custody-system`.
pub fn lease_namespace(flag: Option<&str>, watched: Option<&str>, own: Option<&str>) -> String {
    [flag, watched, own]
        .into_iter()
        .flatten()
        .find(|namespace| !namespace.is_empty())
        .unwrap_or("custody-system")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::lease_namespace;

    #[test]
    fn leases_live_in_custodys_own_namespace() {
        let rows = [
            ((Some("leases"), Some("shop"), Some("custody")), "leases"),
            ((None, Some("shop"), Some("custody")), "shop"),
            ((None, None, Some("custody")), "custody"),
            ((Some(""), Some(""), Some("custody")), "custody"),
            ((None, None, Some("")), "custody-system"),
            ((None, None, None), "custody-system"),
        ];
        for ((flag, watched, own), expected) in rows {
            assert_eq!(
                lease_namespace(flag, watched, own),
                expected,
                "{flag:?} {watched:?} {own:?}"
            );
        }
    }
}
