//! The admission webhook: pods labelled `custody.io/cluster=<name>` of a Cluster whose restore
//! is not complete get `custody-wait` and the readiness gate ([`crate::inject`]). Served over
//! HTTPS on every replica, with a certificate the controller issues and rotates itself
//! ([`certs`]). Registered with `failurePolicy: Fail`, so a labelled pod never starts
//! unguarded: when the webhook cannot decide, the pod is refused and created again later.

pub mod certs;
pub mod requester;
mod serve;

pub use serve::{Settings, run};

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};
use crate::inject::Injection;
use custody_kube::api::{Cluster, Restore, RestorePhase};

/// The label that names a pod's Cluster.
pub use custody_proto::names::LABEL_CLUSTER;
/// The path the API server calls.
pub const PATH: &str = "/mutate-pods";

/// What the webhook does with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not custody's to change: admitted as it is.
    Allow,
    /// Admitted with `custody-wait` and the readiness gate for this Restore.
    Inject {
        restore_name: String,
        restore_uid: String,
    },
    /// Refused, with the reason (the pod's controller creates it again later).
    Deny(String),
}

/// The Restore as the admission decision needs it.
#[derive(Clone, Debug)]
pub struct RestoreFacts<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    /// Controlled by the Cluster (owner reference with its UID).
    pub owned: bool,
    pub phase: Option<RestorePhase>,
}

/// The decision for a pod of Cluster `cluster_name` (from its label): pods of a Cluster under
/// restore are guarded until its own Restore completed; a pod that cannot be guarded yet (the
/// Restore not created, or not the Cluster's own) is refused rather than admitted unguarded.
///
/// A pod labelled with a Cluster that does not exist is refused (a typo, or a StatefulSet
/// applied before its Cluster: the Cluster may yet say to restore into its claims), unless
/// custody knows every claim it mounts holds real data (`known_data`: an earlier Restore
/// verified it or a Backup copied it; `false` when it mounts none), so that an application
/// whose Cluster was deleted on purpose can still recreate its pods. Removing the label from
/// the pod template opts the application out of custody's gate altogether.
pub fn admit(
    cluster_name: &str,
    cluster: Option<(&Cluster, bool)>,
    restore: Option<RestoreFacts<'_>>,
    known_data: bool,
) -> Admission {
    let Some((cluster, deleting)) = cluster else {
        if known_data {
            return Admission::Allow;
        }
        return Admission::Deny(format!(
            "Cluster {cluster_name} does not exist in this namespace: a pod labelled {LABEL_CLUSTER}={cluster_name} is admitted once it exists (apply the Cluster first, or fix the label), or remove the label from the pod template to run it without custody"
        ));
    };
    let Some(spec) = &cluster.spec.restore else {
        return Admission::Allow;
    };
    let completed = restore
        .as_ref()
        .is_some_and(|restore| restore.owned && restore.phase == Some(RestorePhase::Completed));
    if deleting && !completed {
        return Admission::Deny(format!(
            "Cluster {cluster_name} is being deleted while restoring from Backup {}; its pods may not start",
            spec.backup_ref.name
        ));
    }
    match restore {
        Some(restore) if restore.owned => match restore.phase {
            Some(RestorePhase::Completed) => Admission::Allow,
            _ => Admission::Inject {
                restore_name: restore.name.to_string(),
                restore_uid: restore.uid.to_string(),
            },
        },
        Some(restore) => Admission::Deny(format!(
            "Restore {} was not created by Cluster {cluster_name}; its pods are not admitted until the Cluster's own restore exists",
            restore.name
        )),
        None => Admission::Deny(format!(
            "the restore of Cluster {cluster_name} from Backup {} is being set up; the pod is admitted once it exists",
            spec.backup_ref.name
        )),
    }
}

/// A claim the pod mounts that a Cluster's restore writes ([`crate::restoring::restores_claim`]),
/// with what [`admit`] needs about that Cluster.
#[derive(Clone, Debug)]
pub struct ClaimUnderRestore<'a> {
    pub claim: &'a str,
    pub cluster: &'a Cluster,
    pub deleting: bool,
    pub restore: Option<RestoreFacts<'a>>,
}

/// Who created a pod, as far as [`admit_by_claims`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOwner<'a> {
    /// The StatefulSet of this name controls it.
    StatefulSet(&'a str),
    /// A prepareData Job of the Restore with this UID created it (the Job's UID checked, and
    /// the Job owned by that Restore).
    RestoreJob(&'a str),
    /// Anything else, or nothing.
    Other,
}

/// The decision for a pod without the `custody.io/cluster` label, from the claims it mounts
/// that a restore writes (`found`, in the pod's order). A pod of the Cluster's own StatefulSet
/// (its controller, and a StatefulSet pod's name) is treated as if it carried the label: held
/// until its volumes are verified; the restore's own prepareData pods write the claim. Any
/// other pod is refused while that restore has not completed: it would read or write the
/// claim while the restore writes it, and nothing would hold it. A pod that mounts no claim
/// under restore is not custody's.
pub fn admit_by_claims<'a>(
    pod_name: &str,
    owner: PodOwner<'_>,
    found: &[ClaimUnderRestore<'a>],
) -> (Admission, Option<&'a Cluster>) {
    for found in found {
        if let (PodOwner::RestoreJob(writer), Some(restore)) = (owner, &found.restore)
            && restore.owned
            && restore.uid == writer
        {
            continue;
        }
        let cluster_name = found.cluster.metadata.name.as_deref().unwrap_or_default();
        let set = found.cluster.spec.stateful_set_ref.name.as_str();
        let decision = admit(
            cluster_name,
            Some((found.cluster, found.deleting)),
            found.restore.clone(),
            false,
        );
        if decision == Admission::Allow {
            continue;
        }
        // Its own claim: `<template>-<pod name>`, in a StatefulSet pod of the Cluster's set.
        let own = owner == PodOwner::StatefulSet(set)
            && found.claim.ends_with(&format!("-{pod_name}"))
            && pod_name
                .strip_prefix(set)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(crate::restoring::ordinal);
        if own {
            return (decision, Some(found.cluster));
        }
        let backup = found
            .cluster
            .spec
            .restore
            .as_ref()
            .map(|spec| spec.backup_ref.name.as_str())
            .unwrap_or_default();
        let refusal = Admission::Deny(format!(
            "pod {pod_name} mounts claim {}, which the restore of Cluster {cluster_name} from Backup {backup} writes: until that restore completed only the pods of StatefulSet {set} may mount it (they wait until their volumes are verified); create this pod once Restore {} completed",
            found.claim,
            crate::clusters::restore_name(found.cluster),
        ));
        return (refusal, Some(found.cluster));
    }
    (Admission::Allow, None)
}

/// Counts one decision of either webhook under `reason` (`webhook_decisions`).
fn count(context: &WebhookContext, reason: &str) {
    context
        .metrics
        .webhook_decisions
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: reason.into(),
        })
        .inc();
}

/// What the webhook server needs.
pub struct WebhookContext {
    pub client: Client,
    pub wait_image: String,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The user the controller itself authenticates as (a SelfSubjectReview at start): what
    /// it writes comes from objects already checked ([`requester`]).
    pub own_user: std::sync::OnceLock<String>,
    /// Gate certificates name their node ([`crate::inject::gate_env`]).
    pub per_node_gate_names: bool,
}

async fn decide(
    context: &WebhookContext,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<AdmissionResponse> {
    let response = AdmissionResponse::from(request);
    if !matches!(request.operation, Operation::Create) {
        return Ok(response);
    }
    let Some(object) = &request.object else {
        return Ok(response);
    };
    let pod: Pod = serde_json::from_value(serde_json::to_value(object).unwrap_or_default())
        .map_err(|error| Error::Webhook(format!("reading the pod: {error}")))?;
    let namespace = request.namespace.clone().unwrap_or_default();
    let label = pod.labels().get(LABEL_CLUSTER).cloned();
    // Whatever the label says, a claim another Cluster's restore writes holds or refuses it.
    let (by_claims, claims_cluster) =
        by_claims(context, &namespace, &pod, label.as_deref()).await?;
    let Some(cluster_name) = label else {
        let name = claims_cluster
            .as_ref()
            .and_then(|cluster| cluster.metadata.name.clone())
            .unwrap_or_default();
        let templates = claims_cluster
            .map(|cluster| cluster.spec.volume_claim_templates)
            .unwrap_or_default();
        return answer(
            context, response, &namespace, pod, by_claims, &name, templates,
        );
    };
    let clusters: Api<Cluster> = Api::namespaced(context.client.clone(), &namespace);
    let cluster = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(|source| Error::Read {
            object: format!("Cluster {namespace}/{cluster_name}"),
            source,
        })?;
    let restore = match &cluster {
        Some(cluster) if cluster.spec.restore.is_some() => {
            let name = crate::clusters::restore_name(cluster);
            let restores: Api<Restore> = Api::namespaced(context.client.clone(), &namespace);
            restores
                .get_opt(&name)
                .await
                .map_err(|source| Error::Read {
                    object: format!("Restore {namespace}/{name}"),
                    source,
                })?
        }
        _ => None,
    };
    let cluster_uid = cluster
        .as_ref()
        .and_then(|cluster| cluster.metadata.uid.clone())
        .unwrap_or_default();
    let known_data = match &cluster {
        Some(_) => false,
        None => claims_hold_known_data(&context.client, &namespace, &pod).await?,
    };
    let decision = admit(
        &cluster_name,
        cluster
            .as_ref()
            .map(|cluster| (cluster, cluster.metadata.deletion_timestamp.is_some())),
        restore.as_ref().map(|restore| RestoreFacts {
            name: restore.metadata.name.as_deref().unwrap_or_default(),
            uid: restore.metadata.uid.as_deref().unwrap_or_default(),
            owned: crate::ownership::controlled_by(&restore.metadata, "Cluster", &cluster_uid),
            phase: restore.status.as_ref().and_then(|status| status.phase),
        }),
        known_data,
    );
    let (decision, cluster_name, cluster) = match stricter(&decision, &by_claims) {
        Stricter::Label => (decision, cluster_name, cluster),
        Stricter::Claims => {
            let name = claims_cluster
                .as_ref()
                .and_then(|cluster| cluster.metadata.name.clone())
                .unwrap_or_default();
            (by_claims, name, claims_cluster)
        }
    };
    let templates = cluster
        .map(|cluster| cluster.spec.volume_claim_templates)
        .unwrap_or_default();
    answer(
        context,
        response,
        &namespace,
        pod,
        decision,
        &cluster_name,
        templates,
    )
}

/// Which of two decisions about one pod stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stricter {
    /// The decision by the pod's `custody.io/cluster` label.
    Label,
    /// The decision by the claims it mounts that other Clusters' restores write.
    Claims,
}

/// The stricter of the label's and the claims' decisions: a refusal over a hold over an
/// admission; between two of a kind, the label's.
pub fn stricter(by_label: &Admission, by_claims: &Admission) -> Stricter {
    let rank = |admission: &Admission| match admission {
        Admission::Allow => 0,
        Admission::Inject { .. } => 1,
        Admission::Deny(_) => 2,
    };
    if rank(by_claims) > rank(by_label) {
        Stricter::Claims
    } else {
        Stricter::Label
    }
}

/// The webhook's response for `decision` about `pod` of Cluster `cluster_name` (whose volume
/// claim templates are `templates`).
fn answer(
    context: &WebhookContext,
    response: AdmissionResponse,
    namespace: &str,
    pod: Pod,
    decision: Admission,
    cluster_name: &str,
    templates: Vec<String>,
) -> Result<AdmissionResponse> {
    let pod_name = pod_name(&pod);
    match decision {
        Admission::Allow => Ok(response),
        Admission::Deny(reason) => {
            tracing::info!(
                namespace,
                pod = pod_name,
                cluster = cluster_name,
                reason,
                "pod refused"
            );
            count(context, "Denied");
            Ok(response.deny(reason))
        }
        Admission::Inject {
            restore_name,
            restore_uid,
        } => {
            let injection = Injection {
                image: context.wait_image.clone(),
                ca_config_map: crate::restores::GATE_CA_CONFIG_MAP.to_string(),
                restore_name: restore_name.clone(),
                restore_uid,
                claim_templates: templates,
                per_node_gate_names: context.per_node_gate_names,
            };
            let before =
                serde_json::to_value(&pod).map_err(|error| Error::Webhook(error.to_string()))?;
            let after = serde_json::to_value(crate::inject::inject(pod, &injection))
                .map_err(|error| Error::Webhook(error.to_string()))?;
            let patch = json_patch::diff(&before, &after);
            tracing::info!(
                namespace,
                pod = pod_name,
                cluster = cluster_name,
                restore = restore_name,
                "custody-wait injected"
            );
            count(context, "Injected");
            response
                .with_patch(patch)
                .map_err(|error| Error::Webhook(format!("serializing the patch: {error}")))
        }
    }
}

/// The pod's name, or its generated name's prefix before the API server names it.
fn pod_name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .or(pod.metadata.generate_name.clone())
        .unwrap_or_default()
}

/// The claims `pod` mounts.
fn claims_of(pod: &Pod) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| Some(volume.persistent_volume_claim.as_ref()?.claim_name.as_str()))
        .collect()
}

/// Who controls `pod`: its StatefulSet, or a Restore's prepareData Job (read, to check that
/// the Job is the one the pod names and that a Restore owns it).
async fn owner_of(
    client: &Client,
    namespace: &str,
    pod: &Pod,
) -> Result<(Option<String>, Option<String>)> {
    let Some(controller) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
    else {
        return Ok((None, None));
    };
    match (controller.api_version.as_str(), controller.kind.as_str()) {
        ("apps/v1", "StatefulSet") => Ok((Some(controller.name.clone()), None)),
        ("batch/v1", "Job") => {
            let job =
                Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), namespace)
                    .get_opt(&controller.name)
                    .await
                    .map_err(Error::read(format!("Job {namespace}/{}", controller.name)))?;
            let restore_uid = job
                .filter(|job| job.metadata.uid.as_deref() == Some(controller.uid.as_str()))
                .and_then(|job| {
                    let uid = job
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .find(|owner| owner.controller == Some(true) && owner.kind == "Restore")?
                        .uid
                        .clone();
                    crate::restores::decide::owned_job(&job, &uid).then_some(uid)
                });
            Ok((None, restore_uid))
        }
        _ => Ok((None, None)),
    }
}

/// The decision by the claims `pod` mounts that a restore writes ([`admit_by_claims`]),
/// leaving out the Cluster the pod's label names (`labelled`: its own claims are the label's
/// to decide), and the Cluster it is about.
async fn by_claims(
    context: &WebhookContext,
    namespace: &str,
    pod: &Pod,
    labelled: Option<&str>,
) -> Result<(Admission, Option<Cluster>)> {
    let claims = claims_of(pod);
    if claims.is_empty() {
        return Ok((Admission::Allow, None));
    }
    let clusters = Api::<Cluster>::namespaced(context.client.clone(), namespace)
        .list(&kube::api::ListParams::default())
        .await
        .map_err(Error::read(format!("Clusters in {namespace}")))?
        .items;
    let mut wanted: Vec<(&str, &Cluster)> = Vec::new();
    for claim in &claims {
        for cluster in clusters.iter().filter(|cluster| {
            cluster.spec.restore.is_some()
                && cluster.metadata.name.as_deref() != labelled
                && crate::restoring::restores_claim(
                    &cluster.spec.volume_claim_templates,
                    &cluster.spec.stateful_set_ref.name,
                    claim,
                )
        }) {
            wanted.push((claim, cluster));
        }
    }
    if wanted.is_empty() {
        return Ok((Admission::Allow, None));
    }
    let restores: Api<Restore> = Api::namespaced(context.client.clone(), namespace);
    let mut found_restores = Vec::with_capacity(wanted.len());
    for (_, cluster) in &wanted {
        let name = crate::clusters::restore_name(cluster);
        found_restores.push(
            restores
                .get_opt(&name)
                .await
                .map_err(Error::read(format!("Restore {namespace}/{name}")))?,
        );
    }
    let found: Vec<ClaimUnderRestore<'_>> = wanted
        .iter()
        .zip(&found_restores)
        .map(|((claim, cluster), restore)| ClaimUnderRestore {
            claim,
            cluster,
            deleting: cluster.metadata.deletion_timestamp.is_some(),
            restore: restore.as_ref().map(|restore| RestoreFacts {
                name: restore.metadata.name.as_deref().unwrap_or_default(),
                uid: restore.metadata.uid.as_deref().unwrap_or_default(),
                owned: crate::ownership::controlled_by(
                    &restore.metadata,
                    "Cluster",
                    cluster.metadata.uid.as_deref().unwrap_or_default(),
                ),
                phase: restore.status.as_ref().and_then(|status| status.phase),
            }),
        })
        .collect();
    let pod_name = pod_name(pod);
    let (set, writer) = owner_of(&context.client, namespace, pod).await?;
    let owner = match (&set, &writer) {
        (Some(set), _) => PodOwner::StatefulSet(set),
        (_, Some(restore)) => PodOwner::RestoreJob(restore),
        _ => PodOwner::Other,
    };
    let (decision, cluster) = admit_by_claims(&pod_name, owner, &found);
    Ok((decision, cluster.cloned()))
}

/// Whether the pod mounts at least one claim and custody knows each of them holds real data
/// (their [`custody_proto::names::ANNOTATION_KNOWN_DATA`]).
async fn claims_hold_known_data(client: &Client, namespace: &str, pod: &Pod) -> Result<bool> {
    let claims = claims_of(pod);
    if claims.is_empty() {
        return Ok(false);
    }
    for claim in claims {
        if crate::reconciler::known_data(client, namespace, claim).await? != Some(true) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The request of `review`, or the answer that it cannot be read.
#[allow(clippy::result_large_err)] // the error is the answer itself, returned at once
fn request_of(
    review: AdmissionReview<DynamicObject>,
) -> std::result::Result<AdmissionRequest<DynamicObject>, Json<AdmissionReview<DynamicObject>>> {
    review.try_into().map_err(
        |error: kube::core::admission::ConvertAdmissionReviewError| {
            tracing::warn!(%error, "unreadable AdmissionReview");
            Json(AdmissionResponse::invalid(error.to_string()).into_review())
        },
    )
}

async fn mutate(
    State(context): State<Arc<WebhookContext>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request = match request_of(review) {
        Ok(request) => request,
        Err(unreadable) => return unreadable,
    };
    let response = match decide(&context, &request).await {
        Ok(response) => response,
        Err(error) => {
            // Cannot decide: refuse (the pod is created again), never admit unguarded.
            tracing::warn!(%error, "admission failed; pod refused");
            count(&context, "Error");
            AdmissionResponse::from(&request).deny(format!("custody cannot decide yet: {error}"))
        }
    };
    Json(response.into_review())
}

#[cfg(test)]
mod tests;
