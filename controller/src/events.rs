//! Kubernetes Events on custody objects: what a reconciler wants said ([`Note`]) and the
//! [`Recorder`] that publishes it, counting repeats in one series.

use kube::runtime::events::{Event, EventType};

/// An Event a reconciler wants published on the object it reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// What happened, for a person.
    pub text: String,
}

impl Note {
    /// A Normal Event.
    pub fn normal(reason: impl Into<String>, text: impl Into<String>) -> Note {
        Note {
            warning: false,
            reason: reason.into(),
            text: text.into(),
        }
    }

    /// A Warning Event.
    pub fn warning(reason: impl Into<String>, text: impl Into<String>) -> Note {
        Note {
            warning: true,
            reason: reason.into(),
            text: text.into(),
        }
    }
}

/// The API server refuses an Event whose note is longer than this many bytes.
pub const NOTE_LIMIT: usize = 1024;

/// `note` cut to [`NOTE_LIMIT`] bytes at a character boundary, ending in `…` when cut: a long
/// message (many differences, a long error chain) still makes an Event.
pub fn fit_note(note: &str) -> String {
    cut(note, NOTE_LIMIT)
}

/// `text` cut to at most `limit` bytes at a character boundary, ending in `…` when cut.
pub fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let note = text;
    let ellipsis = '…';
    let mut end = limit.saturating_sub(ellipsis.len_utf8());
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ellipsis}", &note[..end])
}

/// How long a published Event is remembered: the same Event again within this time becomes
/// the next count of its series instead of a new object.
const SERIES_TTL: std::time::Duration = std::time::Duration::from_secs(6 * 60);

/// Publishes `events.k8s.io/v1` Events. An Event repeated with the same type, reason, action,
/// object **and note** within [`SERIES_TTL`] is counted in the first one's series; one whose
/// note differs is a new Event. (kube-runtime's recorder leaves the note out of the series
/// key, so a retry that fails for a new reason would keep showing the first reason.)
pub struct Recorder {
    client: kube::Client,
    reporter: kube::runtime::events::Reporter,
    published: tokio::sync::Mutex<std::collections::HashMap<SeriesKey, EventsV1>>,
}

type EventsV1 = k8s_openapi::api::events::v1::Event;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    warning: bool,
    reason: String,
    action: String,
    note: Option<String>,
    uid: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: kube::runtime::events::Reporter) -> Recorder {
        Recorder {
            client,
            reporter,
            published: Default::default(),
        }
    }

    /// Creates the Event, or counts it in its series.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> std::result::Result<(), kube::Error> {
        use k8s_openapi::api::events::v1::EventSeries;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        use kube::api::{Api, Patch, PatchParams, PostParams};

        let now = k8s_openapi::jiff::Timestamp::now();
        let key = SeriesKey {
            warning: matches!(event.type_, EventType::Warning),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
            uid: regarding.uid.clone(),
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
        };
        let mut published = self.published.lock().await;
        published.retain(|_, earlier| {
            let last = earlier
                .series
                .as_ref()
                .map(|series| series.last_observed_time.0)
                .or(earlier.event_time.as_ref().map(|time| time.0));
            last.is_some_and(|last| last + SERIES_TTL > now)
        });
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<EventsV1> = Api::namespaced(self.client.clone(), namespace);
        let written = match published.get(&key) {
            Some(earlier) => {
                let count = earlier.series.as_ref().map_or(2, |series| series.count + 1);
                let patch = serde_json::json!({
                    "series": EventSeries { count, last_observed_time: MicroTime(now) },
                });
                events
                    .patch(
                        earlier.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?
            }
            None => {
                let instance = self
                    .reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone());
                let fresh = EventsV1 {
                    metadata: kube::api::ObjectMeta {
                        namespace: Some(namespace.to_string()),
                        name: Some(format!(
                            "{}.{:x}",
                            regarding.name.as_deref().unwrap_or("custody"),
                            now.as_nanosecond()
                        )),
                        ..Default::default()
                    },
                    event_time: Some(MicroTime(now)),
                    type_: Some(if key.warning { "Warning" } else { "Normal" }.to_string()),
                    reason: Some(event.reason.clone()),
                    action: Some(event.action.clone()),
                    note: event.note.as_deref().map(fit_note),
                    regarding: Some(regarding.clone()),
                    related: event.secondary.clone(),
                    reporting_controller: Some(self.reporter.controller.clone()),
                    reporting_instance: Some(instance),
                    ..Default::default()
                };
                events.create(&PostParams::default(), &fresh).await?
            }
        };
        published.insert(key, written);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_fit_the_api_limit() {
        assert_eq!(fit_note("short"), "short");
        let exact = "a".repeat(NOTE_LIMIT);
        assert_eq!(fit_note(&exact), exact);
        for long in [
            "b".repeat(NOTE_LIMIT + 1),
            "é".repeat(NOTE_LIMIT),
            "ab€".repeat(2000),
        ] {
            let fitted = fit_note(&long);
            assert!(fitted.len() <= NOTE_LIMIT, "{} bytes", fitted.len());
            assert!(fitted.len() > NOTE_LIMIT - 8, "{} bytes", fitted.len());
            assert!(fitted.ends_with('…'));
            assert!(long.starts_with(fitted.trim_end_matches('…')));
        }
    }
}
