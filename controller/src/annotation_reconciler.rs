//! Reports `custody.io/` annotations that custody will not act on, on every custody kind.
//!
//! The decision is [`crate::annotations::problems`]; this module fetches, decides and writes
//! the `AnnotationsRecognized` condition (under its own field manager, so it never touches
//! conditions other reconcilers own) and a Warning Event whenever the set of problems changes.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use crate::events::Recorder;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::annotations::{self, Kind};
use crate::conditions::{self, Status};
use crate::error::{Error, Result};
use crate::metrics::{ErrorLabels, KindLabels, Metrics};
use custody_kube::api::{
    Backup, BackupPlan, BackupRepository, Cluster, HasConditions, NodeAgent, Restore,
};

/// Field manager of the `AnnotationsRecognized` condition.
pub const FIELD_MANAGER: &str = "custody.io/annotations";

/// Event reasons this reconciler publishes.
pub mod event_reasons {
    /// A `custody.io/` annotation custody will not act on.
    pub const UNKNOWN_ANNOTATION: &str = "UnknownAnnotation";
    /// The annotation problems reported earlier are gone.
    pub const ANNOTATIONS_RECOGNIZED: &str = "AnnotationsRecognized";
}

/// A custody kind this reconciler watches.
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
    /// Its name as a metric label.
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
                match namespace {
                    Some(namespace) => Api::namespaced(client, namespace),
                    None => Api::all(client),
                }
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

/// What every reconciliation needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
}

/// Writes the `AnnotationsRecognized` condition of one object and warns on new problems.
pub async fn reconcile<K: CustodyKind>(object: Arc<K>, context: Arc<Context>) -> Result<Action> {
    let labels = KindLabels { kind: K::LABEL };
    context.metrics.reconciliations.get_or_create(&labels).inc();
    let started = Instant::now();

    let problems = annotations::problems(K::KIND, object.annotations());
    let desired = annotations::condition(&problems);
    let current = object.conditions();
    let next = conditions::next(
        current,
        &desired,
        object.meta().generation,
        Timestamp::now(),
    );
    if let Some(next) = next {
        let name = object.name_any();
        let previous = current
            .iter()
            .find(|condition| condition.type_ == next.type_);
        let api = K::api(context.client.clone(), object.meta().namespace.as_deref());
        crate::status::apply(
            &api,
            &name,
            FIELD_MANAGER,
            &describe(&*object),
            &serde_json::json!({ "conditions": [next] }),
        )
        .await?;
        tracing::info!(
            kind = K::LABEL,
            namespace = object.meta().namespace.as_deref().unwrap_or_default(),
            name,
            status = next.status,
            message = next.message,
            "annotation check"
        );

        let event = if desired.status == Status::False
            && previous.is_none_or(|previous| previous.message != next.message)
        {
            context.metrics.warning_events.get_or_create(&labels).inc();
            Some(Event {
                type_: EventType::Warning,
                reason: event_reasons::UNKNOWN_ANNOTATION.into(),
                note: Some(next.message.clone()),
                action: "CheckAnnotations".into(),
                secondary: None,
            })
        } else if desired.status == Status::True
            && previous.is_some_and(|previous| previous.status == Status::False.as_str())
        {
            Some(Event {
                type_: EventType::Normal,
                reason: event_reasons::ANNOTATIONS_RECOGNIZED.into(),
                note: Some(next.message.clone()),
                action: "CheckAnnotations".into(),
                secondary: None,
            })
        } else {
            None
        };
        if let Some(event) = event {
            context
                .recorder
                .publish(&event, &object.object_ref(&()))
                .await
                .map_err(|source| Error::PublishEvent {
                    object: describe(&*object),
                    source,
                })?;
        }
    }

    context
        .metrics
        .reconcile_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    Ok(Action::await_change())
}

/// Logs and counts a failed reconciliation, then retries it.
pub fn error_policy<K: CustodyKind>(
    object: Arc<K>,
    error: &Error,
    context: Arc<Context>,
) -> Action {
    tracing::warn!(kind = K::LABEL, object = describe(&*object), %error, "reconcile failed");
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

fn describe<K: Resource>(object: &K) -> String {
    match &object.meta().namespace {
        Some(namespace) => format!("{namespace}/{}", object.name_any()),
        None => object.name_any(),
    }
}
