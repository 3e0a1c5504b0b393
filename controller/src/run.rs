//! The controller process: connect, start every reconciler and the HTTP endpoints, and stop
//! cleanly on SIGTERM.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use kube::runtime::events::Reporter;

use crate::events::Recorder;
use kube::runtime::{Controller, watcher};

use crate::annotation_reconciler;
use crate::cli::RunOptions;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::reconciler::{self, Context, CustodyKind};
use custody_kube::api::{self, Backup, BackupPlan, BackupRepository, Cluster, NodeAgent, Restore};
use custody_kube::http::{self, Health};

/// Name of the controller in Events and field managers.
pub const CONTROLLER_NAME: &str = "custody-controller";

/// Runs until SIGTERM or SIGINT.
pub async fn run(options: RunOptions) -> Result<()> {
    let client = custody_kube::process::client(options.kubeconfig.as_deref()).await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(Error::ReachApiServer)?;
    tracing::info!(
        apiserver = version.git_version,
        namespace = options.namespace.as_deref().unwrap_or("(all)"),
        "connected"
    );

    let stop = async {
        custody_kube::process::wait_for_signal().await;
        tracing::info!("shutting down");
    }
    .boxed()
    .shared();
    let stopped = move || stop.clone();

    let metrics = Arc::new(Metrics::default());
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: options.instance.clone(),
    };
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(client.clone(), reporter.clone()),
        metrics: metrics.clone(),
        leases: options.lease_namespace(),
        admission: crate::node_slots::Admission::default(),
    });
    let ready = Arc::new(AtomicBool::new(false));
    let health = Health {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };

    let gate_ca = crate::gate_ca::Trust::fixed(match &options.gate_ca_file {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|error| {
            Error::LoadClientConfig(format!("--gate-ca-file {}: {error}", path.display()))
        })?),
        None => None,
    });
    // custody's own CA: gate certificates name their node unless the gate's CA is given.
    let per_node_gate_names = options.ca_secret.is_some() && options.gate_ca_file.is_none();
    let authority = crate::pki::Shared::default();
    let report_swap = Arc::new(custody_kube::tls::Swap::default());
    let certificate_lifetime =
        std::time::Duration::from_secs(u64::from(options.certificate_hours.max(1)) * 3600);
    let report_tls = match (
        &options.report_tls_cert,
        &options.report_tls_key,
        &options.ca_secret,
    ) {
        (Some(cert), Some(key), _) => crate::report_service::Tls::Files(cert.clone(), key.clone()),
        (_, _, Some(_)) => crate::report_service::Tls::Issued(report_swap.clone()),
        _ => crate::report_service::Tls::None,
    };
    let gate_issuer = options
        .ca_secret
        .as_ref()
        .map(|_| crate::report_service::GateIssuer {
            authority: authority.clone(),
            lifetime: certificate_lifetime,
        });
    let pki = {
        let client = client.clone();
        let metrics = metrics.clone();
        let issued_report = matches!(report_tls, crate::report_service::Tls::Issued(_));
        let gate = if per_node_gate_names {
            Some(gate_ca.clone())
        } else {
            None
        };
        let settings = options
            .ca_secret
            .clone()
            .map(|secret| crate::pki::Settings {
                secret,
                ca_lifetime: std::time::Duration::from_secs(10 * 365 * 86_400),
                propagation: std::time::Duration::from_secs(options.ca_propagation_seconds),
                check: std::time::Duration::from_secs(options.ca_check_seconds.max(1)),
                report_names: options.report_names.clone(),
                leaf_lifetime: certificate_lifetime,
            });
        let authority = authority.clone();
        async move {
            match settings {
                Some(settings) => {
                    crate::pki::run(
                        client,
                        settings,
                        authority,
                        issued_report.then_some(report_swap),
                        gate.unwrap_or_default(),
                        metrics,
                    )
                    .await
                }
                None => futures::future::pending().await,
            }
        }
    };
    let namespace = options.namespace.as_deref();
    let mover = crate::mover_job::MoverJob {
        image: options.mover_image.clone(),
        deadline_seconds: options.job_deadline_seconds.max(1),
        cpu_request: options.mover_cpu_request.clone(),
        memory_request: options.mover_memory_request.clone(),
        memory_limit: options.mover_memory_limit.clone(),
        restore_retries: options.restore_job_retries.max(0),
        movers_per_node: options.movers_per_node,
        stalled_after: std::time::Duration::from_secs(options.stalled_after_seconds),
        per_node_gate_names,
    };
    let controllers = futures::future::join_all([
        annotation_controller::<BackupRepository>(&context, namespace, stopped()),
        annotation_controller::<Cluster>(&context, namespace, stopped()),
        annotation_controller::<Backup>(&context, namespace, stopped()),
        annotation_controller::<BackupPlan>(&context, namespace, stopped()),
        annotation_controller::<Restore>(&context, namespace, stopped()),
        annotation_controller::<NodeAgent>(&context, namespace, stopped()),
        crate::repositories::controller(
            Arc::new(crate::repositories::RepositoryContext {
                base: context.clone(),
                mover: mover.clone(),
            }),
            namespace,
            stopped(),
        ),
        crate::plans::controller(context.clone(), namespace, stopped()),
        crate::drills::controller(context.clone(), namespace, stopped()),
        crate::backups::controller(
            Arc::new(crate::backups::BackupContext {
                base: context.clone(),
                mover: mover.clone(),
                gate_ca: gate_ca.clone(),
            }),
            namespace,
            stopped(),
        ),
        crate::clusters::controller(context.clone(), namespace, stopped()),
        crate::restores::controller(
            Arc::new(crate::restores::RestoreContext {
                base: context.clone(),
                mover,
                gate_ca,
            }),
            namespace,
            stopped(),
        ),
    ]);
    // Ready once the webhook listens (the API server sends custody's objects and pods to a
    // ready replica only) and, while this replica leads, once every reconciler's watch has
    // listed what it watches. A replica that does not lead serves the webhook and reports.
    let listening = Arc::new(AtomicBool::new(options.webhook_address.is_none()));
    let leading = Arc::new(AtomicBool::new(options.leader_election_lease.is_none()));
    let readiness = {
        let (ready, listening, leading) = (ready.clone(), listening.clone(), leading.clone());
        async move {
            loop {
                let now = listening.load(Ordering::Relaxed)
                    && (!leading.load(Ordering::Relaxed) || reconciler::synced());
                if ready.swap(now, Ordering::Relaxed) != now {
                    tracing::info!(ready = now, "readiness");
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    };
    let webhook = async {
        let Some(address) = options.webhook_address else {
            return Ok(());
        };
        crate::webhook::run(
            Arc::new(crate::webhook::WebhookContext {
                client: client.clone(),
                wait_image: options.wait_image.clone(),
                metrics: metrics.clone(),
                own_user: std::sync::OnceLock::new(),
                per_node_gate_names,
            }),
            crate::webhook::Settings {
                address,
                configuration: options.webhook_configuration.clone(),
                validating_configuration: options.validating_webhook_configuration.clone(),
                secret: options.webhook_secret.clone(),
                names: options.webhook_names.clone(),
                days: options.webhook_cert_days,
                check: std::time::Duration::from_secs(options.webhook_check_seconds.max(1)),
                ready: listening.clone(),
            },
            stopped(),
        )
        .await
    };
    let reports = crate::report_service::run(
        client.clone(),
        crate::report_service::Settings {
            address: options.report_address,
            tls: report_tls,
            gate_issuer,
            agent_account: options.agent_service_account.clone(),
            heartbeat: std::time::Duration::from_secs(10),
            timeout: std::time::Duration::from_secs(options.agent_timeout_seconds.max(1)),
            scoped: options.namespace.is_some(),
            leading: leading.clone(),
            reporter: reporter.clone(),
        },
        metrics.clone(),
        stopped(),
    );
    let grace = std::time::Duration::from_secs(options.restore_mark_grace_seconds);
    let marks = crate::restoring::run(
        client.clone(),
        options.namespace.clone(),
        grace,
        grace.clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(30),
        ),
        stopped(),
    );
    let backup_health = crate::health::run(
        client.clone(),
        options.namespace.clone(),
        metrics.health.clone(),
        metrics.clone(),
        stopped(),
    );
    // What only the leader does: the reconcilers, the restore marks and backup health.
    let reconciling = async {
        tokio::join!(controllers, marks, backup_health);
    };
    let led = async {
        match &options.leader_election_lease {
            None => {
                // Without an election this replica is the only one, and leads.
                metrics.leader.set(1);
                reconciling.await;
                Ok(())
            }
            Some(lease) => {
                let duration =
                    std::time::Duration::from_secs(options.leader_election_seconds.max(3));
                crate::leader::lead(
                    client.clone(),
                    crate::leader::Settings {
                        namespace: options.lease_namespace(),
                        lease: lease.clone(),
                        identity: crate::leader::identity(options.instance.as_deref()),
                        duration,
                        renew: duration / 3,
                    },
                    leading.clone(),
                    metrics.clone(),
                    reconciling,
                    stopped(),
                )
                .await
            }
        }
    };
    let everyone = async {
        tokio::join!(
            http::serve(options.http_address, health, stopped()),
            reports,
            webhook,
            async {
                tokio::select! {
                    () = pki => {}
                    () = readiness => {}
                    () = stopped() => {}
                }
            }
        )
    };
    let mut everyone = std::pin::pin!(everyone);
    let mut led = std::pin::pin!(led);
    // A lost leadership ends the process at once (its reconcilers may be half-way): the
    // kubelet starts it again as a follower.
    let (served, reported, hooked, _) = tokio::select! {
        result = &mut led => {
            if let Err(error) = result {
                // At once: a blocking task (a repository's key written to S3) must not go on
                // under the new leader.
                tracing::error!(%error, "stopping at once");
                std::process::exit(1);
            }
            everyone.await
        }
        all = &mut everyone => {
            led.await?;
            all
        }
    };
    served?;
    reported?;
    hooked?;
    tracing::info!("stopped");
    Ok(())
}

fn annotation_controller<K: CustodyKind>(
    context: &Arc<Context>,
    namespace: Option<&str>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()> {
    let api = K::api(context.client.clone(), namespace);
    reconciler::run(
        Controller::new(api, watcher::Config::default()),
        annotation_reconciler::reconcile::<K>,
        annotation_reconciler::error_policy::<K>,
        context.clone(),
        stopped,
    )
}

/// The CRDs as one multi-document YAML stream.
pub fn crds_yaml() -> Result<String> {
    let mut out = String::new();
    for crd in api::crds() {
        out.push_str("---\n");
        out.push_str(
            &serde_yaml::to_string(&crd).map_err(|error| Error::WriteCrds(error.to_string()))?,
        );
    }
    Ok(out)
}

/// Writes one `<plural>.<group>.yaml` per CRD into `dir`.
pub fn write_crds(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|error| Error::WriteCrds(format!("{}: {error}", dir.display())))?;
    for crd in api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let yaml =
            serde_yaml::to_string(&crd).map_err(|error| Error::WriteCrds(error.to_string()))?;
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("# Generated by `custody-controller crds`; do not edit.\n{yaml}"),
        )
        .map_err(|error| Error::WriteCrds(format!("{}: {error}", path.display())))?;
    }
    Ok(())
}
