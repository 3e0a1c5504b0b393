//! The scaffold every reconciler shares, written once: the [`Context`] it runs with, the
//! [`Measure`] guard that counts and times a reconciliation, the fresh read it decides on,
//! the [`error_policy`], and the [`run`] tail that drives a `Controller` until shutdown.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::annotations::Kind;
use crate::error::{Error, Result};
use crate::events::{Note, Recorder};
use crate::metrics::{ErrorLabels, KindLabels, Metrics};
use custody_kube::api::{
    Backup, BackupPlan, BackupRepository, Cluster, HasConditions, NodeAgent, Restore,
};

/// What every reconciliation needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The namespace of custody's own Leases (one per Cluster with a run going): the
    /// controller's, so that custody writes Leases nowhere else.
    pub leases: String,
    /// One creation of mover Jobs at a time, so that `--movers-per-node` holds.
    pub admission: crate::node_slots::Admission,
}

/// A custody kind a reconciler watches.
pub trait CustodyKind:
    Resource<DynamicType = ()>
    + HasConditions
    + Clone
    + Debug
    + DeserializeOwned
    + Serialize
    + Send
    + Sync
    + 'static
{
    /// Which kind it is, for the annotation rules.
    const KIND: Kind;
    /// Its name as a metric label and in Events.
    const LABEL: &'static str;
    /// The API for objects of this kind in `namespace` (ignored for cluster-scoped kinds;
    /// `None` means every namespace).
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;
}

macro_rules! namespaced_kind {
    ($($kind:ident),*) => {
        $(impl CustodyKind for $kind {
            const KIND: Kind = Kind::$kind;
            const LABEL: &'static str = stringify!($kind);
            fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
                scoped(client, namespace)
            }
        })*
    };
}

namespaced_kind!(BackupRepository, Cluster, Backup, BackupPlan, Restore);

impl CustodyKind for NodeAgent {
    const KIND: Kind = Kind::NodeAgent;
    const LABEL: &'static str = "NodeAgent";
    fn api(client: Client, _namespace: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}

/// The API of a namespaced kind in `namespace`, or in every namespace for `None` (a
/// controller started with `--namespace` watches only that one).
pub fn scoped<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}

/// Counts a reconciliation of one kind when it starts and records its duration when it ends,
/// however it ends.
pub struct Measure<'a> {
    metrics: &'a Metrics,
    kind: &'static str,
    started: Instant,
}

impl<'a> Measure<'a> {
    /// Starts measuring a reconciliation of `kind`.
    pub fn start(metrics: &'a Metrics, kind: &'static str) -> Measure<'a> {
        metrics
            .reconciliations
            .get_or_create(&KindLabels { kind })
            .inc();
        Measure {
            metrics,
            kind,
            started: Instant::now(),
        }
    }
}

impl Drop for Measure<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .get_or_create(&KindLabels { kind: self.kind })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Measures one reconciliation of `object` and runs `reconcile` on the object as the API
/// server has it now, not as the watch cache last saw it: a status written a moment ago (a
/// started volume, a recorded key) must not be rolled back by a decision on an older copy.
/// An object that is gone needs nothing.
pub async fn on_fresh<K, F>(
    object: &K,
    context: &Context,
    reconcile: impl FnOnce(K) -> F,
) -> Result<Action>
where
    K: CustodyKind + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    F: Future<Output = Result<Action>>,
{
    let _measure = Measure::start(&context.metrics, K::LABEL);
    match crate::status::fresh(object, &context.client).await? {
        Some(current) => reconcile(current).await,
        None => Ok(Action::await_change()),
    }
}

/// Logs and counts a failed reconciliation, then retries it after a few seconds.
pub fn error_policy<K: CustodyKind>(object: &K, error: &Error, context: &Context) -> Action {
    tracing::warn!(kind = K::LABEL, object = describe(object), %error, "reconcile failed");
    context
        .metrics
        .reconcile_failures
        .get_or_create(&ErrorLabels {
            kind: K::LABEL,
            error: error.label(),
        })
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// Drives `controller` until `stopped` completes, finishing the reconciliations under way.
pub fn run<K, C, F>(
    controller: Controller<K>,
    reconcile: impl FnMut(Arc<K>, Arc<C>) -> F + Send + 'static,
    error_policy: impl Fn(Arc<K>, &Error, Arc<C>) -> Action + Send + Sync + 'static,
    context: Arc<C>,
    stopped: impl Future<Output = ()> + Send + Sync + 'static,
) -> futures::future::BoxFuture<'static, ()>
where
    K: CustodyKind,
    C: Send + Sync + 'static,
    F: Future<Output = Result<Action>> + Send + 'static,
{
    let store = controller.store();
    let synced = async move {
        if store.wait_until_ready().await.is_ok() {
            SYNCED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(kind = K::LABEL, "listed");
        }
    };
    STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let run = controller
        .graceful_shutdown_on(stopped)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(kind = K::LABEL, %error, "controller event");
            }
        });
    futures::future::join(run, synced).map(|_| ()).boxed()
}

/// Reconcilers made by [`run`], and those whose watch has listed everything once: the
/// replica is ready when both are equal.
static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SYNCED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether every reconciler made by [`run`] has listed what it watches.
pub fn synced() -> bool {
    SYNCED.load(std::sync::atomic::Ordering::Relaxed)
        >= STARTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Look again after `after`, or when something changes.
pub fn requeue(after: Option<Duration>) -> Action {
    match after {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }
}

/// Creates `job` in `namespace`: the Job as created, or `None` when one is already there under
/// its name (created by an earlier attempt of the same reconciliation, or by someone else).
pub async fn create_job(
    client: &Client,
    namespace: &str,
    job: &k8s_openapi::api::batch::v1::Job,
) -> Result<Option<k8s_openapi::api::batch::v1::Job>> {
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), namespace);
    match jobs.create(&kube::api::PostParams::default(), job).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(source) => Err(Error::Create {
            object: format!("Job {namespace}/{}", job.name_any()),
            source,
        }),
    }
}

/// The annotations of claim `claim`; `None` when it does not exist.
pub async fn claim_annotations(
    client: &Client,
    namespace: &str,
    claim: &str,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    Ok(claims
        .get_opt(claim)
        .await
        .map_err(Error::read(format!(
            "PersistentVolumeClaim {namespace}/{claim}"
        )))?
        .map(|claim| claim.metadata.annotations.unwrap_or_default()))
}

/// Whether claim `claim` carries the known-data mark; `None` when it does not exist.
pub async fn known_data(client: &Client, namespace: &str, claim: &str) -> Result<Option<bool>> {
    Ok(claim_annotations(client, namespace, claim)
        .await?
        .map(|annotations| annotations.contains_key(custody_proto::names::ANNOTATION_KNOWN_DATA)))
}

/// Marks claim `claim` as holding real data, saying how custody knows (`how`): see
/// [`custody_proto::names::ANNOTATION_KNOWN_DATA`]. A claim that is gone needs no mark.
pub async fn mark_known_data(
    client: &Client,
    namespace: &str,
    claim: &str,
    how: &str,
) -> Result<()> {
    annotate_claim(
        client,
        namespace,
        claim,
        serde_json::json!({ custody_proto::names::ANNOTATION_KNOWN_DATA: how }),
    )
    .await
}

/// Marks claim `claim` as verified by Restore `restore` (`restore_uid`): the known-data mark
/// (`how`) and that Restore's own record
/// ([`custody_proto::names::verified_by_restore`]), which outlives the Restore.
pub async fn mark_verified_by_restore(
    client: &Client,
    namespace: &str,
    claim: &str,
    how: &str,
    restore: &str,
    restore_uid: &str,
) -> Result<()> {
    annotate_claim(
        client,
        namespace,
        claim,
        serde_json::json!({
            custody_proto::names::ANNOTATION_KNOWN_DATA: how,
            custody_proto::names::verified_by_restore(restore_uid): restore,
        }),
    )
    .await
}

/// Merges `annotations` into claim `claim`'s; a claim that is gone is left so.
async fn annotate_claim(
    client: &Client,
    namespace: &str,
    claim: &str,
    annotations: serde_json::Value,
) -> Result<()> {
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"metadata": {"annotations": annotations}});
    match claims
        .patch(
            claim,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Patch {
            object: format!("PersistentVolumeClaim {namespace}/{claim}"),
            source,
        }),
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub fn describe<K: Resource>(object: &K) -> String {
    match &object.meta().namespace {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}

/// Publishes `note` on `object` as the reconciler's `action`, counting Warnings per kind.
pub async fn publish<K: CustodyKind>(
    context: &Context,
    object: &K,
    action: &str,
    note: &Note,
) -> Result<()> {
    if note.warning {
        context
            .metrics
            .warning_events
            .get_or_create(&KindLabels { kind: K::LABEL })
            .inc();
    }
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.clone(),
        note: Some(note.text.clone()),
        action: action.to_string(),
        secondary: None,
    };
    context
        .recorder
        .publish(&event, &object.object_ref(&()))
        .await
        .map_err(|source| Error::PublishEvent {
            object: format!("{} {}", K::LABEL, describe(object)),
            source,
        })
}
