//! The agent-report gRPC service: agents send heartbeats with their volumes' states and
//! exchange clock timestamps; the controller writes one NodeAgent per node from them, and
//! turns a node not Ready when its agent falls silent.

use std::sync::Arc;
use std::time::Duration;

use custody_proto::authn;
use custody_proto::clock::now_unix_nanos;
use custody_proto::names;
use custody_proto::report::agent_report_server::{AgentReport, AgentReportServer};
use custody_proto::report::{
    ClockRequest, ClockResponse, GateCertificate, GateCertificateRequest, NodeReport, ReportAck,
};
use futures::FutureExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::error::{Error, Result};
use crate::metrics::{Metrics, NodeLabels};
use crate::node_agents;
use custody_kube::api::{NodeAgent, NodeAgentSpec, NodeAgentStatus};

/// Field manager of everything the report service writes on NodeAgents.
pub const FIELD_MANAGER: &str = "custody.io/agent-report";

/// How the report service runs.
#[derive(Clone, Debug)]
pub struct Settings {
    pub address: std::net::SocketAddr,
    /// Where the serving certificate comes from; plain HTTP/2 without one.
    pub tls: Tls,
    /// Signs the gates' certificates; none without `--ca-secret`.
    pub gate_issuer: Option<GateIssuer>,
    /// The agents' ServiceAccount, `namespace:name`.
    pub agent_account: String,
    /// How often agents are asked to report.
    pub heartbeat: Duration,
    /// Silence after which a node turns not Ready.
    pub timeout: Duration,
    /// The controller watches one namespace (`--namespace`): other controllers may hear other
    /// nodes, so only the nodes that reported here are marked silent.
    pub scoped: bool,
    /// Whether this replica leads: only the leader marks silent nodes (one writer, one clock
    /// comparing heartbeats).
    pub leading: Arc<std::sync::atomic::AtomicBool>,
    /// Who publishes the Events about reported thaws.
    pub reporter: kube::runtime::events::Reporter,
}

/// The report service's certificate.
#[derive(Clone, Debug)]
pub enum Tls {
    /// Plain HTTP/2 (tests, or a mesh that provides TLS).
    None,
    /// PEM certificate and key files, re-read as they change.
    Files(std::path::PathBuf, std::path::PathBuf),
    /// Issued from custody's CA ([`crate::pki::run`] keeps `Swap` current).
    Issued(Arc<custody_kube::tls::Swap>),
}

/// custody's CA, signing the gates' certificates (whatever the report service serves with).
#[derive(Clone, Debug)]
pub struct GateIssuer {
    pub authority: crate::pki::Shared,
    /// Lifetime of a gate certificate.
    pub lifetime: Duration,
}

struct Service {
    client: Client,
    reviewer: custody_kube::authn::Reviewer,
    settings: Settings,
    metrics: Arc<Metrics>,
    /// The nodes whose agents reported to this process.
    heard: std::sync::Mutex<std::collections::BTreeSet<String>>,
    recorder: crate::events::Recorder,
}

impl Service {
    /// Says on its Backup that a freeze of `node` was thawed by the node's watchdog or its
    /// restarted agent, and when: the mover, its call broken, only knew when it noticed.
    /// Whether the thaw is dealt with: said, or about a Backup that is gone or ran on another
    /// node (then only logged). Not dealt with (the API server did not answer): the agent sends
    /// it again; the report itself is never refused for it.
    async fn say_thawed(&self, node: &str, thaw: &custody_proto::report::ThawReport) -> bool {
        let backup = match thaw.backup_name.is_empty() {
            true => None,
            false => match Api::<custody_kube::api::Backup>::namespaced(
                self.client.clone(),
                &thaw.namespace,
            )
            .get_opt(&thaw.backup_name)
            .await
            {
                Ok(backup) => backup,
                Err(error) => {
                    tracing::warn!(node, namespace = thaw.namespace, backup = thaw.backup_name, %error, "reading the Backup of a reported thaw; the agent sends it again");
                    return false;
                }
            },
        };
        let note = thaw_note(node, thaw);
        let theirs = backup.filter(|backup| {
            backup.metadata.uid.as_deref() == Some(thaw.backup_uid.as_str())
                && backup
                    .status
                    .as_ref()
                    .and_then(|status| status.node_name.as_deref())
                    == Some(node)
        });
        if let Some(backup) = &theirs {
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: note.reason.clone(),
                note: Some(crate::events::fit_note(&note.text)),
                action: "Freeze".into(),
                secondary: None,
            };
            if let Err(error) = self
                .recorder
                .publish(&event, &kube::Resource::object_ref(backup, &()))
                .await
            {
                tracing::warn!(node, namespace = thaw.namespace, backup = thaw.backup_name, %error, "publishing the Event of a reported thaw; the agent sends it again");
                return false;
            }
        }
        tracing::warn!(
            node,
            namespace = thaw.namespace,
            backup = thaw.backup_name,
            device = thaw.device,
            thawer = thaw.thawer,
            on_backup = theirs.is_some(),
            "{}",
            note.text
        );
        self.metrics
            .freezes_thawed_without_agent
            .get_or_create(&crate::metrics::ThawerLabels {
                thawer: thaw.thawer.clone(),
            })
            .inc();
        true
    }

    /// Whether this process judges `node`'s silence.
    fn judges(&self, node: &str) -> bool {
        self.settings
            .leading
            .load(std::sync::atomic::Ordering::Relaxed)
            && (!self.settings.scoped || self.heard.lock().is_ok_and(|heard| heard.contains(node)))
    }
}

/// What a thaw by the watchdog or a restarted agent says on its Backup: who thawed, when, and
/// how long after the freeze, against its bound.
pub fn thaw_note(node: &str, thaw: &custody_proto::report::ThawReport) -> crate::events::Note {
    let at = |nanos: i64| {
        Timestamp::from_nanosecond(i128::from(nanos))
            .map(|time| time.to_string())
            .unwrap_or_else(|_| format!("{nanos} ns"))
    };
    let held = (thaw.thawed_at_unix_nanos - thaw.frozen_at_unix_nanos) as f64 / 1e9;
    let (reason, what) = match thaw.thawer.as_str() {
        "watchdog" => (
            "ThawedByWatchdog",
            "did not thaw claim {claim} by its bound (it had stopped, or its own thaw failed): its watchdog thawed",
        ),
        _ => (
            "ThawedByRestartedAgent",
            "stopped while claim {claim} was frozen: the agent, restarted, thawed",
        ),
    };
    let what = what.replace("{claim}", &thaw.claim_name);
    crate::events::Note::warning(
        reason,
        format!(
            "the agent on node {node} {what} the filesystem (device {}) at {}, {held:.1} s after it was frozen at {} (bound {} s); the mover had reported the freeze lost when its call broke, not when the filesystem thawed",
            thaw.device,
            at(thaw.thawed_at_unix_nanos),
            at(thaw.frozen_at_unix_nanos),
            thaw.max_seconds
        ),
    )
}

/// Serves the report service and watches for silent agents until `stop` completes.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let address = settings.address;
    let serve_error = |source: tonic::transport::Error| Error::ServeReports {
        address: address.to_string(),
        message: source.to_string(),
    };
    let server = custody_kube::grpc::bounded(Server::builder());
    let swap = match &settings.tls {
        Tls::None => None,
        Tls::Files(cert, key) => {
            let swap = Arc::new(custody_kube::tls::Swap::default());
            let follow = custody_kube::tls::follow_files(
                swap.clone(),
                cert.clone(),
                key.clone(),
                Duration::from_secs(30),
            );
            // The first read is checked here: a missing file stops the controller with why.
            let mut follow = Box::pin(follow);
            tokio::select! {
                biased;
                result = &mut follow => {
                    let Err(message) = result;
                    return Err(Error::ServeReports { address: address.to_string(), message });
                }
                () = tokio::task::yield_now() => {}
            }
            tokio::spawn(follow);
            Some(swap)
        }
        Tls::Issued(swap) => Some(swap.clone()),
    };
    let service = Arc::new(Service {
        reviewer: custody_kube::authn::Reviewer::new(client.clone()),
        client: client.clone(),
        settings: settings.clone(),
        metrics,
        heard: Default::default(),
        recorder: crate::events::Recorder::new(client.clone(), settings.reporter.clone()),
    });
    tracing::info!(%address, tls = swap.is_some(), "serving agent reports");
    let silence = watch_for_silence(service.clone());
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| Error::ServeReports {
            address: address.to_string(),
            message: format!("listening: {error}"),
        })?;
    let mut server = server;
    let router = server.add_service(AgentReportServer::from_arc(service));
    let incoming = custody_kube::grpc::counted_incoming(listener);
    let served = match swap {
        Some(swap) => {
            let acceptor = custody_kube::tls::acceptor(swap, &[b"h2"]).map_err(|message| {
                Error::ServeReports {
                    address: address.to_string(),
                    message,
                }
            })?;
            router
                .serve_with_incoming_shutdown(
                    custody_kube::tls::incoming(
                        incoming,
                        acceptor,
                        custody_kube::grpc::TLS_HANDSHAKE_TIMEOUT,
                    ),
                    stop,
                )
                .boxed()
        }
        None => router.serve_with_incoming_shutdown(incoming, stop).boxed(),
    };
    tokio::select! {
        result = served => result.map_err(serve_error),
        () = silence => Ok(()),
    }
}

/// Every few seconds, turns nodes whose agent fell silent not Ready.
async fn watch_for_silence(service: Arc<Service>) {
    let mut tick =
        tokio::time::interval((service.settings.timeout / 4).max(Duration::from_secs(1)));
    let api: Api<NodeAgent> = Api::all(service.client.clone());
    loop {
        tick.tick().await;
        let agents = match api.list(&ListParams::default()).await {
            Ok(agents) => agents,
            Err(error) => {
                tracing::warn!(%error, "listing NodeAgents");
                continue;
            }
        };
        for agent in agents {
            let Some(current) = &agent.status else {
                continue;
            };
            let Some(status) = node_agents::status_after_silence(
                current,
                Timestamp::now(),
                service.settings.timeout,
            ) else {
                continue;
            };
            let name = agent.name_any();
            if !service.judges(&name) {
                continue;
            }
            tracing::warn!(
                node = name,
                message = status.conditions[0].message,
                "agent silent"
            );
            if let Err(error) = service.write_status(&name, status).await {
                tracing::warn!(node = name, %error, "marking NodeAgent not ready");
            }
        }
    }
}

impl Service {
    /// What the agents are told about renewing their gate certificates: certificates issued
    /// before when are to be replaced, and the CA that signs now.
    fn renewal(&self) -> (i64, String) {
        self.settings
            .gate_issuer
            .as_ref()
            .and_then(|issuer| issuer.authority.current())
            .map(|current| (current.reissue_after, current.name))
            .unwrap_or_default()
    }

    async fn write_status(&self, node: &str, status: NodeAgentStatus) -> Result<()> {
        let api: Api<NodeAgent> = Api::all(self.client.clone());
        crate::status::apply(
            &api,
            node,
            FIELD_MANAGER,
            &format!("NodeAgent {node}"),
            &status,
        )
        .await
        .map(|_| ())
    }

    /// Whether the caller is the agent of `node` (its token, reviewed).
    async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        node: &str,
    ) -> Result<(), Status> {
        let refuse = |reason: &str, status: Status| {
            tracing::warn!(node, reason, message = status.message(), "report refused");
            self.metrics
                .report_refusals
                .get_or_create(&crate::metrics::ReasonLabels {
                    reason: reason.to_string(),
                })
                .inc();
            status
        };
        let token = custody_kube::authn::bearer_token(metadata)
            .ok_or_else(|| refuse("NoToken", Status::unauthenticated("no bearer token")))?;
        let review = self
            .reviewer
            .review(token, names::REPORT_AUDIENCE, |_| Ok(()))
            .await;
        if custody_kube::authn::asked(&review) {
            self.metrics.report_token_reviews.inc();
        }
        let review = review.map_err(|error| {
            let (reason, status) = error.status();
            refuse(reason, status)
        })?;
        authn::report_caller(&review, &self.settings.agent_account, node).map_err(|refusal| {
            let (reason, status) = custody_kube::authn::refusal_status(&refusal);
            refuse(reason, status)
        })
    }
}

#[tonic::async_trait]
impl AgentReport for Service {
    async fn exchange_clock(
        &self,
        request: Request<ClockRequest>,
    ) -> Result<Response<ClockResponse>, Status> {
        let controller_received = now_unix_nanos();
        let node_sent = request.get_ref().node_sent_unix_nanos;
        Ok(Response::new(ClockResponse {
            node_sent_unix_nanos: node_sent,
            controller_received_unix_nanos: controller_received,
            controller_sent_unix_nanos: now_unix_nanos(),
        }))
    }

    async fn report(&self, request: Request<NodeReport>) -> Result<Response<ReportAck>, Status> {
        self.authenticate(request.metadata(), &request.get_ref().node_name)
            .await?;
        let report = request.into_inner();
        let node = report.node_name.clone();
        let api: Api<NodeAgent> = Api::all(self.client.clone());
        let internal = |error: kube::Error| {
            tracing::warn!(node, %error, "writing NodeAgent");
            Status::unavailable(format!("writing NodeAgent {node}: {error}"))
        };
        let current = match api.get_opt(&node).await.map_err(internal)? {
            Some(agent) => agent,
            None => {
                let mut object = NodeAgent::new(
                    &node,
                    NodeAgentSpec {
                        node_name: node.clone(),
                    },
                );
                // Owned by its Node: when the Node goes, the garbage collector removes it.
                let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
                if let Some(found) = nodes.get_opt(&node).await.map_err(internal)? {
                    object.metadata.owner_references = Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: node.clone(),
                            uid: found.metadata.uid.unwrap_or_default(),
                            ..Default::default()
                        },
                    ]);
                }
                api.patch(
                    &node,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(internal)?
            }
        };
        let status =
            node_agents::status_from_report(&report, current.status.as_ref(), Timestamp::now());
        if let Some(clock) = report.clock {
            let labels = NodeLabels { node: node.clone() };
            self.metrics
                .node_clock_offset_seconds
                .get_or_create(&labels)
                .set(clock.offset_nanos as f64 / 1e9);
            self.metrics
                .node_clock_round_trip_seconds
                .get_or_create(&labels)
                .set(clock.round_trip_nanos as f64 / 1e9);
        }
        self.write_status(&node, status).await.map_err(|error| {
            tracing::warn!(node, %error, "writing NodeAgent status");
            Status::unavailable(error.to_string())
        })?;
        let mut thaws_accepted = Vec::new();
        for thaw in &report.thaws {
            if self.say_thawed(&node, thaw).await {
                thaws_accepted.push(thaw.id.clone());
            }
        }
        self.metrics.agent_reports.inc();
        if let Ok(mut heard) = self.heard.lock() {
            heard.insert(node.clone());
        }
        tracing::debug!(node, volumes = report.volumes.len(), "report");
        let (reissue_after_unix, signing_ca) = self.renewal();
        Ok(Response::new(ReportAck {
            heartbeat_seconds: self.settings.heartbeat.as_secs() as u32,
            reissue_after_unix,
            signing_ca,
            thaws_accepted,
        }))
    }

    async fn issue_gate_certificate(
        &self,
        request: Request<GateCertificateRequest>,
    ) -> Result<Response<GateCertificate>, Status> {
        let node = request.get_ref().node_name.clone();
        self.authenticate(request.metadata(), &node).await?;
        let Some(issuer) = &self.settings.gate_issuer else {
            return Err(Status::failed_precondition(
                "this controller issues no gate certificates (it runs without --ca-secret): give the agent --gate-tls-cert and --gate-tls-key",
            ));
        };
        let Some(current) = issuer.authority.current() else {
            return Err(Status::unavailable(
                "custody's CA is not read yet; ask again shortly",
            ));
        };
        let public_key = &request.get_ref().public_key;
        if public_key.len() != 65 || public_key[0] != 0x04 {
            return Err(Status::invalid_argument(format!(
                "the public key is not an uncompressed ECDSA P-256 point ({} bytes)",
                public_key.len()
            )));
        }
        let issued = crate::pki::sign(
            &current,
            &[crate::pki::gate_name(&node)],
            public_key,
            Timestamp::now().as_second(),
            issuer.lifetime.as_secs() as i64,
        )
        .map_err(|error| {
            tracing::error!(node, %error, "signing a gate certificate");
            Status::internal(error.to_string())
        })?;
        self.metrics.gate_certificates_issued.inc();
        tracing::info!(
            node,
            not_after = issued.not_after,
            "gate certificate issued"
        );
        Ok(Response::new(GateCertificate {
            certificate_pem: issued.cert,
            issued_at_unix: issued.issued_at,
            not_after_unix: issued.not_after,
            reissue_after_unix: current.reissue_after,
            signing_ca: current.name,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thaw(thawer: &str) -> custody_proto::report::ThawReport {
        custody_proto::report::ThawReport {
            namespace: "ns".into(),
            backup_name: "nightly".into(),
            backup_uid: "uid".into(),
            claim_name: "data-db-0".into(),
            device: "7:3".into(),
            thawer: thawer.into(),
            frozen_at_unix_nanos: 1_764_900_000_000_000_000,
            thawed_at_unix_nanos: 1_764_900_005_080_000_000,
            max_seconds: 5,
            id: "f1".into(),
        }
    }

    /// The Event says who thawed, when, how long after the freeze, and the bound.
    #[test]
    fn a_reported_thaw_says_who_thawed_when_against_the_bound() {
        let note = thaw_note("node-a", &thaw("watchdog"));
        assert!(note.warning);
        assert_eq!(note.reason, "ThawedByWatchdog");
        for part in [
            "node node-a",
            "claim data-db-0",
            "its watchdog thawed",
            "device 7:3",
            "at 2025-12-05T02:00:05.08Z",
            "5.1 s after it was frozen at 2025-12-05T02:00:00Z",
            "(bound 5 s)",
        ] {
            assert!(note.text.contains(part), "{part:?} in {}", note.text);
        }
        let restarted = thaw_note("node-a", &thaw("agent"));
        assert_eq!(restarted.reason, "ThawedByRestartedAgent");
        assert!(
            restarted.text.contains("the agent, restarted, thawed"),
            "{}",
            restarted.text
        );
    }
}
