//! The gate: `custody-wait` in a workload pod asks whether its restored volumes are
//! verified. The caller is identified by the TokenReview of its pod-bound token, never by
//! what it sends; it hears only about its own pod, and only if the pod is on this node.

use std::pin::Pin;
use std::sync::Arc;

use custody_proto::authn::{self, KnownPod};
use custody_proto::gate::gate_server::{Gate, GateServer};
use custody_proto::gate::{FreezeProgress, FreezeRequest, WaitProgress, WaitRequest};
use custody_proto::names;
use futures::{Stream, StreamExt};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::metrics;
use crate::state::Agent;

/// Serves the gate on the agent's gate address until `stop` completes.
pub async fn serve(
    agent: Arc<Agent>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let address = agent.options.gate_address;
    let serve_error = |source| Error::ServeGate {
        address: address.to_string(),
        source,
    };
    let swap = agent.gate_certificate.clone();
    match (&agent.options.gate_tls_cert, &agent.options.gate_tls_key) {
        (Some(cert), Some(key)) => {
            // Files (cert-manager, or made by hand), followed as they are renewed.
            let mut follow = Box::pin(custody_kube::tls::follow_files(
                swap.clone(),
                cert.clone(),
                key.clone(),
                std::time::Duration::from_secs(30),
            ));
            tokio::select! {
                biased;
                result = &mut follow => {
                    let Err(message) = result;
                    return Err(Error::GateCertificate(message));
                }
                () = tokio::task::yield_now() => {}
            }
            tokio::spawn(follow);
        }
        _ => {
            let Some(url) = agent.options.report_url.clone() else {
                return Err(Error::GateCertificate(
                    "neither --gate-tls-cert/--gate-tls-key nor --report-url: the gate has no way to a certificate".into(),
                ));
            };
            tokio::spawn(crate::certificate::run(agent.clone(), url));
            // No certificate, no gate: callers are told the agent is unreachable, and retry.
            let mut said = false;
            while !swap.is_set() {
                if !said {
                    tracing::info!("the gate waits for its certificate from the controller");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    let acceptor = custody_kube::tls::acceptor(swap, &[b"h2"]).map_err(Error::GateCertificate)?;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::ListenGate {
            address: address.to_string(),
            source,
        })?;
    tracing::info!(%address, "serving the gate");
    custody_kube::grpc::bounded(Server::builder())
        .add_service(GateServer::new(GateService {
            reviewer: custody_kube::authn::Reviewer::new(agent.client.clone()),
            agent,
        }))
        .serve_with_incoming_shutdown(
            custody_kube::tls::incoming(
                custody_kube::grpc::counted_incoming(listener),
                acceptor,
                custody_kube::grpc::TLS_HANDSHAKE_TIMEOUT,
            ),
            stop,
        )
        .await
        .map_err(serve_error)
}

struct GateService {
    agent: Arc<Agent>,
    reviewer: custody_kube::authn::Reviewer,
}

type Progress = Pin<Box<dyn Stream<Item = Result<WaitProgress, Status>> + Send>>;
type Freezing = Pin<Box<dyn Stream<Item = Result<FreezeProgress, Status>> + Send>>;

impl GateService {
    fn refuse(&self, reason: &str, status: Status) -> Status {
        metrics::count(&self.agent.metrics.gate_refusals, reason);
        tracing::info!(reason, message = status.message(), "gate call refused");
        status
    }

    fn refused(&self, refusal: authn::Refusal) -> Status {
        let (reason, status) = custody_kube::authn::refusal_status(&refusal);
        self.refuse(reason, status)
    }

    /// A token refused before its review, too many reviews at once, or a review that failed.
    fn review_failed(&self, error: custody_kube::authn::ReviewError) -> Status {
        if let custody_kube::authn::ReviewError::Failed(_) = error {
            tracing::warn!(%error, "TokenReview failed");
        }
        let (reason, status) = error.status();
        self.refuse(reason, status)
    }

    fn known_pod(&self, uid: &str) -> Option<KnownPod> {
        self.agent
            .pods
            .state()
            .iter()
            .find(|pod| pod.metadata.uid.as_deref() == Some(uid))
            .map(|pod| KnownPod {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                node_name: pod
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.node_name.clone())
                    .unwrap_or_default(),
            })
    }
}

impl GateService {
    /// The pod on this node the caller's token is bound to, or the refusal.
    async fn caller(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<authn::GateCaller, Status> {
        let Some(token) = custody_kube::authn::bearer_token(metadata) else {
            return Err(self.refuse(
                "NoToken",
                Status::unauthenticated("no bearer token: present the pod's projected token"),
            ));
        };
        // The pod the token claims must be one this agent knows on its node before the API
        // server is asked (a forged token naming another pod costs no review). The pod may
        // have been created a moment ago: the watch is in sync first.
        if !self.agent.wait_until_synced().await {
            return Err(Status::unavailable("the agent is shutting down"));
        }
        let own_node = &self.agent.options.node_name;
        let known =
            |claimed: &authn::Claimed| match (&claimed.node, self.known_pod(&claimed.pod_uid)) {
                (Some(node), _) if node != own_node => Err(authn::Refusal::OtherNode {
                    expected: own_node.clone(),
                    found: node.clone(),
                }),
                (_, Some(pod)) if &pod.node_name == own_node => Ok(()),
                _ => Err(authn::Refusal::PodNotOnThisNode(format!(
                    "with UID {}",
                    claimed.pod_uid
                ))),
            };
        let review = self
            .reviewer
            .review(token, names::GATE_AUDIENCE, known)
            .await;
        if custody_kube::authn::asked(&review) {
            self.agent.metrics.token_reviews.inc();
        }
        let review = review.map_err(|error| self.review_failed(error))?;
        let caller = authn::gate_caller(&review, &self.agent.options.node_name, |uid| {
            self.known_pod(uid)
        })
        .map_err(|refusal| self.refused(refusal))?;
        tracing::debug!(namespace = caller.namespace, pod = caller.name, "gate call");
        Ok(caller)
    }
}

#[tonic::async_trait]
impl Gate for GateService {
    type WaitStream = Progress;
    type FreezeStream = Freezing;

    async fn wait(&self, request: Request<WaitRequest>) -> Result<Response<Progress>, Status> {
        let caller = self.caller(request.metadata()).await?;

        let agent = self.agent.clone();
        let stream = futures::stream::unfold(
            (agent.subscribe(), None::<WaitProgress>, false),
            move |(mut view, mut last, finished)| {
                let caller = caller.clone();
                let agent = agent.clone();
                async move {
                    if finished {
                        return None;
                    }
                    loop {
                        if last.is_some() && view.changed().await.is_err() {
                            return None;
                        }
                        let snapshot = view.borrow_and_update().clone();
                        let Some(progress) =
                            snapshot.progress(&caller.pod_uid, &caller.namespace, &caller.name)
                        else {
                            let status = Status::not_found(format!(
                                "pod {}/{} is no longer on this node",
                                caller.namespace, caller.name
                            ));
                            return Some((Err(status), (view, last, true)));
                        };
                        if last.as_ref() == Some(&progress) {
                            continue;
                        }
                        let released = progress.released;
                        if released {
                            agent.metrics.gate_releases.inc();
                        }
                        last = Some(progress.clone());
                        return Some((Ok(progress), (view, last, released)));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn freeze(&self, request: Request<FreezeRequest>) -> Result<Response<Freezing>, Status> {
        let caller = self.caller(request.metadata()).await?;
        let request = request.into_inner();
        let frozen = crate::freeze::serve(&self.agent, &caller, &request)
            .await
            .map_err(|(reason, status)| self.refuse(reason, status))?;
        let (frozen, max_seconds) = frozen;
        let first = FreezeProgress {
            frozen_at_unix_nanos: k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
            max_seconds,
            device: frozen.device().to_string(),
        };
        // The bound is kept by a task of its own, not by the response stream: a caller that
        // stops reading (a zero HTTP/2 window) cannot delay it. Dropping the stream (the
        // caller cancelled, the connection dropped, the agent stops) drops `released`, and
        // the task thaws at once. The watchdog container thaws at the same bound if the agent
        // itself is gone.
        let (released, dropped) = tokio::sync::oneshot::channel::<()>();
        let bound = frozen.time_left();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(bound) => frozen.end("BoundPassed"),
                _ = dropped => drop(frozen),
            }
        });
        let bound = futures::stream::once(async move {
            tokio::time::sleep(bound).await;
            drop(released);
            Err(Status::deadline_exceeded(format!(
                "thawed at the bound of {max_seconds} s"
            )))
        });
        let stream = futures::stream::once(async move { Ok(first) }).chain(bound);
        Ok(Response::new(Box::pin(stream)))
    }
}
