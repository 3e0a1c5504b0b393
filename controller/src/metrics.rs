//! Prometheus metrics of the controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

/// Labels naming a node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// Labels naming a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Labels naming who thawed a frozen filesystem: `watchdog` or `agent` (restarted).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThawerLabels {
    pub thawer: String,
}

/// Labels naming how a Backup or Restore ended: `result` Completed or Failed, and the reason
/// its `Ready` condition gives.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
    pub reason: String,
}

/// Labels naming how one attempt at an artifact's deletion ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeletionLabels {
    pub result: &'static str,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Histogram buckets from `start`, each `factor` times the one before.
fn exponential(start: f64, factor: f64, count: u16) -> impl Iterator<Item = f64> {
    (0..count).map(move |step| start * factor.powi(i32::from(step)))
}

/// The controller's metrics, registered once at start-up.
pub struct Metrics {
    pub registry: Registry,
    pub reconciliations: Family<KindLabels, Counter>,
    pub reconcile_failures: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<KindLabels, Histogram>,
    pub warning_events: Family<KindLabels, Counter>,
    /// Reports accepted from node agents.
    pub agent_reports: Counter,
    /// Reports refused, by reason.
    pub report_refusals: Family<ReasonLabels, Counter>,
    /// TokenReviews the report service asked of the API server.
    pub report_token_reviews: Counter,
    /// 1 while this replica leads (runs the reconcilers).
    pub leader: prometheus_client::metrics::gauge::Gauge,
    /// Gate certificates signed for agents.
    pub gate_certificates_issued: Counter,
    /// When custody's CA was last read (Unix seconds), and when its signing CA expires.
    pub ca_checked_at_seconds: prometheus_client::metrics::gauge::Gauge,
    /// Each node's clock offset from the controller's, from its agent's best sample.
    pub node_clock_offset_seconds: Family<NodeLabels, FloatGauge>,
    pub node_clock_round_trip_seconds: Family<NodeLabels, FloatGauge>,
    /// Admission decisions on labelled pods: Injected, Denied, Error.
    pub webhook_decisions: Family<ReasonLabels, Counter>,
    /// Freezes a node's watchdog, or its restarted agent, thawed (the agent had stopped), by
    /// thawer (`watchdog`, `agent`), as agents reported them.
    pub freezes_thawed_without_agent: Family<ThawerLabels, Counter>,
    /// Backup health derived from the objects (`custody_` gauges; see [`crate::health`]).
    pub health: crate::health::Shared,
    /// Backups that ended, by result and reason (`custody_backups_finished_total`).
    pub backups_finished: Family<ResultLabels, Counter>,
    pub restores_finished: Family<ResultLabels, Counter>,
    pub backup_duration: Histogram,
    pub backup_size: Histogram,
    pub backup_freeze_duration: Histogram,
    pub restore_duration: Histogram,
    pub restore_size: Histogram,
    /// Attempts at deleting a Backup's artifact, by result.
    pub artifact_deletions: Family<DeletionLabels, Counter>,
    /// Restore drills that ended, by result and reason (`custody_drills_finished_total`).
    pub drills_finished: Family<ResultLabels, Counter>,
}

impl Metrics {
    /// Counts a Backup or Restore that ended, with its duration, size and freeze.
    pub fn finished(&self, finished: &crate::health::Finished) {
        use crate::health::FinishedKind;
        let labels = ResultLabels {
            result: if finished.completed {
                "Completed"
            } else {
                "Failed"
            },
            reason: finished.reason.clone(),
        };
        let (counter, duration, size) = match finished.kind {
            FinishedKind::Backup => (
                &self.backups_finished,
                &self.backup_duration,
                &self.backup_size,
            ),
            FinishedKind::Restore => (
                &self.restores_finished,
                &self.restore_duration,
                &self.restore_size,
            ),
        };
        counter.get_or_create(&labels).inc();
        if let Some(seconds) = finished.duration {
            duration.observe(seconds);
        }
        if let Some(bytes) = finished.bytes {
            size.observe(bytes as f64);
        }
        if let Some(seconds) = finished.frozen {
            self.backup_freeze_duration.observe(seconds);
        }
    }

    /// Counts a restore drill that ended: `result` Passed, Failed or Cancelled.
    pub fn drill_finished(&self, result: &str, reason: &str) {
        let result = match result {
            "Passed" => "Passed",
            "Cancelled" => "Cancelled",
            _ => "Failed",
        };
        self.drills_finished
            .get_or_create(&ResultLabels {
                result,
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts one attempt at deleting an artifact: `Deleted`, `Failed`, `Kept` (its
    /// namespace went first) or `Released` (nothing to delete, or not provably its own).
    pub fn artifact_deletion(&self, result: &'static str) {
        self.artifact_deletions
            .get_or_create(&DeletionLabels { result })
            .inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        // `custody_`: what users alert on (backup health); `custody_controller_`: the
        // controller's own workings.
        let mut root = Registry::with_prefix("custody");
        let health = crate::health::Shared::default();
        root.register_collector(Box::new(health.clone()));
        let backups_finished = Family::<ResultLabels, Counter>::default();
        root.register(
            "backups_finished",
            "Backups that ended (seen by the leading controller), by result and reason",
            backups_finished.clone(),
        );
        let restores_finished = Family::<ResultLabels, Counter>::default();
        root.register(
            "restores_finished",
            "Restores that ended (seen by the leading controller), by result and reason",
            restores_finished.clone(),
        );
        let backup_duration = Histogram::new(exponential(1.0, 2.0, 17));
        root.register(
            "backup_duration_seconds",
            "From a Backup's start to its end",
            backup_duration.clone(),
        );
        let restore_duration = Histogram::new(exponential(1.0, 2.0, 17));
        root.register(
            "restore_duration_seconds",
            "From a Restore's start to its end (every volume verified)",
            restore_duration.clone(),
        );
        let backup_size = Histogram::new(exponential(1_048_576.0, 4.0, 11));
        root.register(
            "backup_size_bytes",
            "Bytes a completed Backup read from its volumes",
            backup_size.clone(),
        );
        let restore_size = Histogram::new(exponential(1_048_576.0, 4.0, 11));
        root.register(
            "restore_size_bytes",
            "Bytes a completed Restore wrote",
            restore_size.clone(),
        );
        let backup_freeze_duration = Histogram::new(exponential(0.01, 2.0, 17));
        root.register(
            "backup_freeze_duration_seconds",
            "How long a Frozen backup held its filesystems frozen (the application's writes stalled)",
            backup_freeze_duration.clone(),
        );
        let artifact_deletions = Family::<DeletionLabels, Counter>::default();
        root.register(
            "artifact_deletions",
            "Attempts at deleting a Backup's artifact, by result (Deleted, Failed, Kept, Released)",
            artifact_deletions.clone(),
        );
        let drills_finished = Family::<ResultLabels, Counter>::default();
        root.register(
            "drills_finished",
            "Restore drills that ended, by result (Passed, Failed, Cancelled) and reason",
            drills_finished.clone(),
        );
        let registry = root.sub_registry_with_prefix("controller");
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
        let agent_reports = Counter::default();
        registry.register(
            "agent_reports",
            "Reports accepted from node agents",
            agent_reports.clone(),
        );
        let report_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "agent_report_refusals",
            "Agent reports refused, by reason",
            report_refusals.clone(),
        );
        let report_token_reviews = Counter::default();
        registry.register(
            "agent_report_token_reviews",
            "TokenReviews the report service asked of the API server",
            report_token_reviews.clone(),
        );
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (runs the reconcilers), else 0",
            leader.clone(),
        );
        let gate_certificates_issued = Counter::default();
        registry.register(
            "gate_certificates_issued",
            "Gate certificates custody's CA signed for node agents",
            gate_certificates_issued.clone(),
        );
        let ca_checked_at_seconds = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "ca_checked_at_seconds",
            "When this replica last read custody's CA and renewed what was due (Unix seconds)",
            ca_checked_at_seconds.clone(),
        );
        let node_clock_offset_seconds = Family::<NodeLabels, FloatGauge>::default();
        registry.register(
            "node_clock_offset_seconds",
            "How far each node's clock is ahead of the controller's",
            node_clock_offset_seconds.clone(),
        );
        let node_clock_round_trip_seconds = Family::<NodeLabels, FloatGauge>::default();
        registry.register(
            "node_clock_round_trip_seconds",
            "Round trip of the clock sample each node's offset comes from",
            node_clock_round_trip_seconds.clone(),
        );
        let webhook_decisions = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "webhook_decisions",
            "Admission decisions on pods of Clusters, by outcome",
            webhook_decisions.clone(),
        );
        let freezes_thawed_without_agent = Family::<ThawerLabels, Counter>::default();
        registry.register(
            "freezes_thawed_without_agent",
            "Freezes a node's watchdog or restarted agent thawed in the agent's stead, by thawer, as agents reported them",
            freezes_thawed_without_agent.clone(),
        );
        Metrics {
            registry: root,
            health,
            backups_finished,
            restores_finished,
            backup_duration,
            backup_size,
            backup_freeze_duration,
            restore_duration,
            restore_size,
            artifact_deletions,
            drills_finished,
            webhook_decisions,
            freezes_thawed_without_agent,
            agent_reports,
            report_refusals,
            report_token_reviews,
            gate_certificates_issued,
            ca_checked_at_seconds,
            leader,
            node_clock_offset_seconds,
            node_clock_round_trip_seconds,
            reconciliations,
            reconcile_failures,
            reconcile_duration,
            warning_events,
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
