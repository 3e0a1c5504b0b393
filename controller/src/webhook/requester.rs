//! The validating webhook for custody's own kinds: a Backup, BackupPlan, Cluster, Restore or
//! BackupRepository is admitted only when the user who writes it may do directly what custody
//! would do for it ([`crate::requester`]), asked of the API server with one
//! SubjectAccessReview per permission. An update that leaves the spec as it was (a finalizer,
//! a label) is not asked again.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use custody_kube::api::{Backup, BackupPlan, BackupRepository, Cluster, Restore};
use custody_kube::s3::Signer;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use super::{WebhookContext, count};
use crate::error::{Error, Result};
use crate::requester::{
    Access, ClusterRepository, Object, Source, opt_in_verdict, opted_in, required, verdict,
};

/// The path the API server calls.
pub const PATH: &str = "/validate-requester";

fn read<K: serde::de::DeserializeOwned>(object: &DynamicObject) -> Result<K> {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|error| Error::Webhook(format!("reading the object: {error}")))
}

/// The repository Cluster `name` names, if it exists and names one.
async fn cluster_repository(
    context: &WebhookContext,
    namespace: &str,
    name: &str,
) -> Result<Option<String>> {
    Ok(
        Api::<Cluster>::namespaced(context.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::read(format!("Cluster {namespace}/{name}")))?
            .and_then(|cluster| cluster.spec.repository_ref)
            .map(|reference| reference.name),
    )
}

fn named(repository: &Option<String>) -> ClusterRepository<'_> {
    match repository {
        Some(name) => ClusterRepository::Named(name),
        None => ClusterRepository::Unknown,
    }
}

/// BackupRepository `name`, if it exists.
async fn repository(
    context: &WebhookContext,
    namespace: &str,
    name: &str,
) -> Result<Option<BackupRepository>> {
    Api::<BackupRepository>::namespaced(context.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::read(format!("BackupRepository {namespace}/{name}")))
}

/// The repository a Backup uses: its own `repositoryRef`, else `cluster_repository` (what its
/// Cluster names), when that exists.
async fn repository_of(
    context: &WebhookContext,
    namespace: &str,
    backup: &Backup,
    cluster_repository: Option<&str>,
) -> Result<Option<BackupRepository>> {
    match backup
        .spec
        .repository_ref
        .as_ref()
        .map(|reference| reference.name.as_str())
        .or(cluster_repository)
    {
        Some(name) => repository(context, namespace, name).await,
        None => Ok(None),
    }
}

/// Whose data a Restore's Backup holds, as read from the API server.
enum RestoreSource {
    OwnCluster,
    OtherCluster {
        cluster: String,
        secrets: Vec<Signer>,
    },
    Unknown,
}

impl RestoreSource {
    fn borrowed(&self) -> Source<'_> {
        match self {
            RestoreSource::OwnCluster => Source::OwnCluster,
            RestoreSource::OtherCluster { cluster, secrets } => {
                Source::OtherCluster { cluster, secrets }
            }
            RestoreSource::Unknown => Source::Unknown,
        }
    }
}

/// Backup `name`, restored into Cluster `target`: of that Cluster, or of another, with the
/// Secrets that open the repository it was written to (recorded in its status, else its own
/// `repositoryRef`, else its Cluster's).
async fn restore_source(
    context: &WebhookContext,
    namespace: &str,
    name: &str,
    target: &str,
) -> Result<RestoreSource> {
    let Some(backup) = Api::<Backup>::namespaced(context.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(Error::read(format!("Backup {namespace}/{name}")))?
    else {
        return Ok(RestoreSource::Unknown);
    };
    let cluster = backup.spec.cluster_ref.name.clone();
    if cluster == target {
        return Ok(RestoreSource::OwnCluster);
    }
    let recorded = backup
        .status
        .as_ref()
        .and_then(|status| status.artifact.as_ref())
        .map(|artifact| artifact.repository.clone())
        .filter(|name| !name.is_empty());
    let repository = match recorded {
        Some(name) => repository(context, namespace, &name).await?,
        None => {
            let of_cluster = cluster_repository(context, namespace, &cluster).await?;
            repository_of(context, namespace, &backup, of_cluster.as_deref()).await?
        }
    };
    let Some(repository) = repository else {
        return Ok(RestoreSource::Unknown);
    };
    let mut secrets = vec![Signer::of(&repository.spec)];
    if let Some(encryption) = &repository.spec.encryption {
        secrets.push(Signer::Secret(encryption.key_secret_ref.name.clone()));
    }
    Ok(RestoreSource::OtherCluster { cluster, secrets })
}

/// Whether a write by `user` is the controller's own (`own`): a BackupPlan's run or an
/// imported snapshot, made from objects whose writers were checked. Its own ServiceAccount
/// lacks some of what it checks for (`create pods`), by design.
pub fn trusted(user: Option<&str>, own: Option<&str>) -> bool {
    matches!((user, own), (Some(user), Some(own)) if user == own && !own.is_empty())
}

/// Learns the controller's own user, once (tried again at the next request when it fails).
pub async fn learn_own_user(context: &WebhookContext) {
    match own_user(&context.client).await {
        Ok(user) => {
            tracing::info!(user, "the requester check trusts what this user writes");
            let _ = context.own_user.set(user);
        }
        Err(error) => tracing::warn!(
            %error,
            "cannot tell which user the controller is yet: what it writes is checked like any writer's"
        ),
    }
}

/// The user this client authenticates as.
pub async fn own_user(client: &kube::Client) -> Result<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|source| Error::Create {
            object: "SelfSubjectReview".into(),
            source,
        })?;
    review
        .status
        .and_then(|status| status.user_info)
        .and_then(|user| user.username)
        .ok_or_else(|| Error::Webhook("the SelfSubjectReview named no user".into()))
}

/// `access` in `namespace`, as an access review asks it.
fn attributes(namespace: &str, access: &Access) -> ResourceAttributes {
    ResourceAttributes {
        namespace: Some(access.namespace.as_deref().unwrap_or(namespace).to_string()),
        verb: Some(access.verb.to_string()),
        group: Some(access.group.to_string()),
        resource: Some(access.resource.to_string()),
        subresource: access.subresource.map(str::to_string),
        name: access.name.clone(),
        ..ResourceAttributes::default()
    }
}

/// Whether the request's user may do `access` in `namespace`.
async fn allowed(
    context: &WebhookContext,
    request: &AdmissionRequest<DynamicObject>,
    namespace: &str,
    access: &Access,
) -> Result<bool> {
    let user = &request.user_info;
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(attributes(namespace, access)),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(context.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| Error::Create {
            object: format!("SubjectAccessReview ({})", access.permission()),
            source,
        })?;
    Ok(answer.status.is_some_and(|status| status.allowed))
}

async fn decide(
    context: &WebhookContext,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<AdmissionResponse> {
    let response = AdmissionResponse::from(request);
    let (Some(object), Operation::Create | Operation::Update) =
        (&request.object, &request.operation)
    else {
        return Ok(response);
    };
    if let Some(old) = &request.old_object
        && old.data.get("spec") == object.data.get("spec")
    {
        return Ok(response);
    }
    if context.own_user.get().is_none() {
        learn_own_user(context).await;
    }
    if trusted(
        request.user_info.username.as_deref(),
        context.own_user.get().map(String::as_str),
    ) {
        return Ok(response);
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    let (needed, consent) = match request.kind.kind.as_str() {
        "Backup" => {
            let backup: Backup = read(object)?;
            let cluster =
                cluster_repository(context, &namespace, &backup.spec.cluster_ref.name).await?;
            let credentials = match &backup.spec.command {
                Some(_) => repository_of(context, &namespace, &backup, cluster.as_deref())
                    .await?
                    .map(|repository| Signer::of(&repository.spec)),
                None => None,
            };
            both(Object::Backup {
                spec: &backup.spec,
                command_credentials: credentials.as_ref(),
                cluster_repository: named(&cluster),
            })
        }
        "BackupPlan" => {
            let plan: BackupPlan = read(object)?;
            let cluster =
                cluster_repository(context, &namespace, &plan.spec.cluster_ref.name).await?;
            both(Object::BackupPlan {
                spec: &plan.spec,
                cluster_repository: named(&cluster),
            })
        }
        "Cluster" => {
            let cluster: Cluster = read(object)?;
            let source = match &cluster.spec.restore {
                Some(restore) => {
                    restore_source(context, &namespace, &restore.backup_ref.name, &request.name)
                        .await?
                }
                None => RestoreSource::OwnCluster,
            };
            both(Object::Cluster {
                spec: &cluster.spec,
                source: source.borrowed(),
            })
        }
        "Restore" => {
            let restore: Restore = read(object)?;
            let cluster = Api::<Cluster>::namespaced(context.client.clone(), &namespace)
                .get_opt(&restore.spec.cluster_ref.name)
                .await
                .map_err(Error::read(format!(
                    "Cluster {namespace}/{}",
                    restore.spec.cluster_ref.name
                )))?;
            let source = restore_source(
                context,
                &namespace,
                &restore.spec.backup_ref.name,
                &restore.spec.cluster_ref.name,
            )
            .await?;
            both(Object::Restore {
                stateful_set: cluster
                    .as_ref()
                    .map(|cluster| cluster.spec.stateful_set_ref.name.as_str()),
                source: source.borrowed(),
            })
        }
        "BackupRepository" => both(Object::BackupRepository(
            &read::<BackupRepository>(object)?.spec,
        )),
        _ => return Ok(response),
    };
    let mut answers = Vec::with_capacity(needed.len());
    for access in &needed {
        answers.push(allowed(context, request, &namespace, access).await?);
    }
    let user = request.user_info.username.clone().unwrap_or_default();
    let reason = match verdict(&user, &namespace, &needed, &answers) {
        None => "RequesterAllowed",
        Some(refusal) => {
            tracing::info!(
                namespace,
                kind = request.kind.kind,
                name = request.name,
                user,
                refusal,
                "custody object refused"
            );
            count(context, "RequesterRefused");
            return Ok(response.deny(refusal));
        }
    };
    let mut granted = Vec::with_capacity(consent.len());
    for access in &consent {
        granted.push(custody_may(context, &namespace, access).await?);
    }
    let custody = context.own_user.get().cloned().unwrap_or_default();
    if let Some(refusal) = opt_in_verdict(&custody, &namespace, &consent, &granted) {
        tracing::info!(
            namespace,
            kind = request.kind.kind,
            name = request.name,
            refusal,
            "custody object refused: the namespace has not granted custody what it needs"
        );
        count(context, "NamespaceNotOptedIn");
        return Ok(response.deny(refusal));
    }
    // `spec.restore` is set only at creation (immutable afterwards): later edits need no mark.
    if request.kind.kind == "Cluster"
        && matches!(request.operation, Operation::Create)
        && object.data.pointer("/spec/restore").is_some()
        && !request.dry_run
    {
        // Before the Cluster exists, so that none of its pods is created in a namespace the
        // restore gate does not see ([`crate::restoring`]).
        crate::restoring::mark(&context.client, &namespace).await?;
    }
    count(context, reason);
    Ok(response)
}

/// What custody would do for `object` with its writer's rights, and with rights of its own
/// that only the namespace's admin grants.
fn both(object: Object<'_>) -> (Vec<Access>, Vec<Access>) {
    (required(object), opted_in(object))
}

/// Whether custody's own user may do `access` in `namespace` (a SelfSubjectAccessReview,
/// which every authenticated user may create).
async fn custody_may(context: &WebhookContext, namespace: &str, access: &Access) -> Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(attributes(namespace, access)),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(context.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| Error::Create {
            object: format!("SelfSubjectAccessReview ({})", access.permission()),
            source,
        })?;
    Ok(answer.status.is_some_and(|status| status.allowed))
}

pub(super) async fn validate(
    State(context): State<Arc<WebhookContext>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request = match super::request_of(review) {
        Ok(request) => request,
        Err(unreadable) => return unreadable,
    };
    let response = match decide(&context, &request).await {
        Ok(response) => response,
        Err(error) => {
            // Cannot ask: refuse (the writer tries again), never act on unchecked rights.
            tracing::warn!(%error, "requester check failed; object refused");
            count(&context, "Error");
            AdmissionResponse::from(&request).deny(format!(
                "custody cannot check the writer's rights yet: {error}"
            ))
        }
    };
    Json(response.into_review())
}

#[cfg(test)]
mod tests {
    use super::trusted;

    #[test]
    fn only_the_controllers_own_writes_are_trusted() {
        let rows = [
            (
                Some("system:serviceaccount:custody-system:custody-controller"),
                Some("system:serviceaccount:custody-system:custody-controller"),
                true,
            ),
            (
                Some("system:serviceaccount:shop:writer"),
                Some("system:serviceaccount:custody-system:custody-controller"),
                false,
            ),
            (Some("system:serviceaccount:shop:writer"), None, false),
            (
                None,
                Some("system:serviceaccount:custody-system:custody-controller"),
                false,
            ),
            (None, None, false),
            (Some(""), Some(""), false),
        ];
        for (user, own, expected) in rows {
            assert_eq!(trusted(user, own), expected, "{user:?} {own:?}");
        }
    }
}
