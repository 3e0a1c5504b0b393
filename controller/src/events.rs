//! Publishing Kubernetes Events on custody objects, counted in the metrics.

use kube::Resource;
use kube::runtime::events::{Event, EventType};

use crate::annotation_reconciler::Context;
use crate::error::{Error, Result};
use crate::metrics::KindLabels;

/// Publishes a Normal or Warning Event on `object` (counting Warnings per `kind`).
pub async fn publish<K: Resource<DynamicType = ()>>(
    context: &Context,
    object: &K,
    kind: &'static str,
    warning: bool,
    reason: &str,
    note: String,
    action: &str,
) -> Result<()> {
    if warning {
        context
            .metrics
            .warning_events
            .get_or_create(&KindLabels { kind })
            .inc();
    }
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    context
        .recorder
        .publish(&event, &object.object_ref(&()))
        .await
        .map_err(|source| Error::PublishEvent {
            object: format!(
                "{kind} {}/{}",
                object.meta().namespace.as_deref().unwrap_or_default(),
                object.meta().name.as_deref().unwrap_or_default()
            ),
            source,
        })
}
