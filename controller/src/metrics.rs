//! Prometheus metrics of the controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels naming the reconciled kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// Labels naming the reconciled kind and the error variant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: &'static str,
    pub error: &'static str,
}

/// The controller's metrics, registered once at start-up.
pub struct Metrics {
    pub registry: Registry,
    pub reconciliations: Family<KindLabels, Counter>,
    pub reconcile_failures: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<KindLabels, Histogram>,
    pub warning_events: Family<KindLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("custody_controller");
        let reconciliations = Family::<KindLabels, Counter>::default();
        registry.register(
            "reconciliations",
            "Reconciliations started",
            reconciliations.clone(),
        );
        let reconcile_failures = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_failures",
            "Reconciliations that failed, by error",
            reconcile_failures.clone(),
        );
        let reconcile_duration = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
        });
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconciliation",
            reconcile_duration.clone(),
        );
        let warning_events = Family::<KindLabels, Counter>::default();
        registry.register(
            "warning_events",
            "Warning Events published on custody objects",
            warning_events.clone(),
        );
        Metrics {
            registry,
            reconciliations,
            reconcile_failures,
            reconcile_duration,
            warning_events,
        }
    }
}

impl Metrics {
    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
