//! Prometheus metrics of the agent.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels naming an outcome or reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Labels naming a volume state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// The agent's metrics.
pub struct Metrics {
    registry: Registry,
    /// Finished verifications by reason (`Verified` or the failure reason).
    pub verifications: Family<ReasonLabels, Counter>,
    pub verification_duration: Histogram,
    pub verified_bytes: Counter,
    /// Gate calls refused, by reason.
    pub gate_refusals: Family<ReasonLabels, Counter>,
    /// Gate streams that ended with the pod released.
    pub gate_releases: Counter,
    /// TokenReviews the gate asked of the API server.
    pub token_reviews: Counter,
    /// Restored volumes on the node by state.
    pub volumes: Family<StateLabels, Gauge>,
    /// How far the node's clock is ahead of the controller's, from the best recent sample.
    pub clock_offset_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub clock_round_trip_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Reports sent to the controller, by result (`Sent` or the error).
    pub reports: Family<ReasonLabels, Counter>,
    /// Gate certificates asked of the controller: Issued, Failed.
    pub gate_certificates: Family<ReasonLabels, Counter>,
    /// Freezes ended, by how (`Released`, `BoundPassed`, `ThawedByWatchdog`, `ThawedAtStart`),
    /// and refused, by reason (`AlreadyFrozen`, ...).
    pub freezes: Family<ReasonLabels, Counter>,
    /// Filesystems frozen now.
    pub frozen: Gauge,
    /// How long filesystems stayed frozen.
    pub frozen_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("custody_agent");
        let verifications = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "verifications",
            "Finished volume verifications, by result",
            verifications.clone(),
        );
        let verification_duration = Histogram::new([
            0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
        ]);
        registry.register(
            "verification_duration_seconds",
            "Time to verify one volume",
            verification_duration.clone(),
        );
        let verified_bytes = Counter::default();
        registry.register(
            "verified_bytes",
            "Bytes hashed by successful verifications",
            verified_bytes.clone(),
        );
        let gate_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "gate_refusals",
            "Gate calls refused, by reason",
            gate_refusals.clone(),
        );
        let token_reviews = Counter::default();
        registry.register(
            "gate_token_reviews",
            "TokenReviews the gate asked of the API server (junk and other audiences never cost one)",
            token_reviews.clone(),
        );
        let gate_releases = Counter::default();
        registry.register(
            "gate_releases",
            "Gate streams that released their pod",
            gate_releases.clone(),
        );
        let volumes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "volumes",
            "Restored volumes on this node, by state",
            volumes.clone(),
        );
        let clock_offset_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "clock_offset_seconds",
            "How far this node's clock is ahead of the controller's",
            clock_offset_seconds.clone(),
        );
        let clock_round_trip_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "clock_round_trip_seconds",
            "Round trip of the clock sample the offset comes from",
            clock_round_trip_seconds.clone(),
        );
        let gate_certificates = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "gate_certificates",
            "Gate certificates asked of the controller's CA, by outcome (Issued, Failed)",
            gate_certificates.clone(),
        );
        let reports = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "reports",
            "Reports sent to the controller, by result",
            reports.clone(),
        );
        let freezes = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "freezes",
            "Filesystem freezes ended or refused, by outcome",
            freezes.clone(),
        );
        let frozen = Gauge::default();
        registry.register(
            "frozen_filesystems",
            "Filesystems frozen now",
            frozen.clone(),
        );
        let frozen_duration = Histogram::new([
            0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
        ]);
        registry.register(
            "frozen_duration_seconds",
            "How long a filesystem stayed frozen",
            frozen_duration.clone(),
        );
        Metrics {
            registry,
            freezes,
            frozen,
            frozen_duration,
            verifications,
            verification_duration,
            verified_bytes,
            gate_refusals,
            gate_releases,
            token_reviews,
            volumes,
            clock_offset_seconds,
            clock_round_trip_seconds,
            reports,
            gate_certificates,
        }
    }
}

impl custody_kube::http::Exposition for Metrics {
    fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// Counts one event under `reason`.
pub fn count(family: &Family<ReasonLabels, Counter>, reason: &str) {
    family
        .get_or_create(&ReasonLabels {
            reason: reason.to_string(),
        })
        .inc();
}
