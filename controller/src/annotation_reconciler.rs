//! Reports `custody.io/` annotations that custody will not act on, on every custody kind.
//!
//! The decision is [`crate::annotations::problems`]; this module fetches, decides and writes
//! the `AnnotationsRecognized` condition (under its own field manager, so it never touches
//! conditions other reconcilers own) and a Warning Event whenever the set of problems changes.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::annotations;
use crate::conditions::{self, Status};
use crate::error::{Error, Result};
use crate::events::Note;
use crate::reconciler::{Context, CustodyKind, Measure, describe};

/// Field manager of the `AnnotationsRecognized` condition.
pub const FIELD_MANAGER: &str = "custody.io/annotations";

/// Event reasons this reconciler publishes.
pub mod event_reasons {
    /// A `custody.io/` annotation custody will not act on.
    pub const UNKNOWN_ANNOTATION: &str = "UnknownAnnotation";
    /// The annotation problems reported earlier are gone.
    pub const ANNOTATIONS_RECOGNIZED: &str = "AnnotationsRecognized";
}

/// Writes the `AnnotationsRecognized` condition of one object and warns on new problems.
pub async fn reconcile<K: CustodyKind>(object: Arc<K>, context: Arc<Context>) -> Result<Action> {
    let _measure = Measure::start(&context.metrics, K::LABEL);
    let problems = annotations::problems(K::KIND, object.annotations());
    let desired = annotations::condition(&problems);
    let current = object.conditions();
    let Some(next) = conditions::next(
        current,
        &desired,
        object.meta().generation,
        Timestamp::now(),
    ) else {
        return Ok(Action::await_change());
    };
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
    let note = if desired.status == Status::False
        && previous.is_none_or(|previous| previous.message != next.message)
    {
        Some(Note::warning(
            event_reasons::UNKNOWN_ANNOTATION,
            next.message.clone(),
        ))
    } else if desired.status == Status::True
        && previous.is_some_and(|previous| previous.status == Status::False.as_str())
    {
        Some(Note::normal(
            event_reasons::ANNOTATIONS_RECOGNIZED,
            next.message.clone(),
        ))
    } else {
        None
    };
    if let Some(note) = note {
        crate::reconciler::publish(&context, &*object, "CheckAnnotations", &note).await?;
    }
    Ok(Action::await_change())
}

/// Retries a failed check after a few seconds.
pub fn error_policy<K: CustodyKind>(
    object: Arc<K>,
    error: &Error,
    context: Arc<Context>,
) -> Action {
    crate::reconciler::error_policy(&*object, error, &context)
}
