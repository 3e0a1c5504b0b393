//! Reports to the controller: a heartbeat with every restored volume's state (periodically
//! and on every change) and the NTP-style clock exchange.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use custody_proto::clock::{Exchange, Sample, best_sample};
use custody_proto::report::agent_report_client::AgentReportClient;
use custody_proto::report::{ClockRequest, ClockSample, NodeReport, VolumeReport};
use tonic::transport::Channel;

use crate::metrics;
use crate::node::{NodeView, wire_state};
use crate::state::Agent;
use crate::upstream;
use crate::volume_state::State;
use custody_proto::clock::now_unix_nanos;

/// Exchanges per clock measurement; the one with the smallest round trip counts.
const EXCHANGES_PER_MEASUREMENT: usize = 4;

/// Reports until the process stops. Without a report URL the agent runs on its own.
pub async fn run(agent: Arc<Agent>) {
    let Some(url) = agent.options.report_url.clone() else {
        tracing::info!("no report URL: not reporting to a controller");
        return futures::future::pending().await;
    };
    // The CA bundle the channel was made with: a changed bundle (custody's CA rotated) makes
    // a new channel, the agent keeps running.
    let mut trust = agent.report_trust.subscribe();
    let mut client = loop {
        match upstream::channel(&agent, &url) {
            Ok(channel) => break AgentReportClient::new(channel),
            Err(error) => {
                // The CA's ConfigMap may not be published yet on a new install.
                tracing::warn!(url, %error, "cannot set up the report channel yet; trying again when the CA bundle changes (or in 5 s)");
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(5), trust.changed()).await;
            }
        }
    };
    trust.mark_unchanged();
    let mut samples: VecDeque<(Instant, Sample, i64)> = VecDeque::new();
    let mut view = agent.subscribe();
    let mut movers = agent.movers.subscribe();
    let mut heartbeat = tokio::time::interval(agent.options.heartbeat);
    let mut clock = tokio::time::interval(agent.options.clock_interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = clock.tick() => {
                measure(&agent, &mut client, &mut samples).await;
                continue;
            }
            _ = heartbeat.tick() => {}
            changed = view.changed() => if changed.is_err() { return },
            changed = movers.changed() => if changed.is_err() { return },
        }
        if trust.has_changed().unwrap_or(false) {
            trust.mark_unchanged();
            match upstream::channel(&agent, &url) {
                Ok(channel) => {
                    tracing::info!("the report service's CA bundle changed: reconnecting with it");
                    client = AgentReportClient::new(channel);
                }
                Err(error) => {
                    tracing::warn!(%error, "the report service's new CA bundle is not usable")
                }
            }
        }
        let snapshot = view.borrow_and_update().clone();
        let best = best_sample(samples.iter().map(|(_, sample, _)| *sample)).and_then(|best| {
            samples
                .iter()
                .find(|(_, sample, _)| *sample == best)
                .map(|(_, sample, at)| ClockSample {
                    offset_nanos: clamp(sample.offset_nanos),
                    round_trip_nanos: clamp(sample.round_trip_nanos),
                    measured_at_unix_nanos: *at,
                })
        });
        let thawed = crate::freeze::thaw_records(&agent.options.state_dir);
        let report = NodeReport {
            node_name: agent.options.node_name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            clock: best,
            volumes: volume_reports(&snapshot),
            thaws: thawed
                .iter()
                .map(|(_, record)| thaw_report(record))
                .collect(),
            movers: movers.borrow_and_update().clone(),
        };
        let mut request = tonic::Request::new(report);
        upstream::authorize(&agent, &mut request);
        match client.report(request).await {
            Ok(ack) => {
                metrics::count(&agent.metrics.reports, "Sent");
                // Said on their Backups (or nothing to say them on): forgotten; the others
                // go again with the next report.
                let accepted = &ack.get_ref().thaws_accepted;
                for (file, record) in &thawed {
                    if accepted.contains(&record.id) {
                        let _ = std::fs::remove_file(file);
                    }
                }
                crate::certificate::told(
                    &agent,
                    ack.get_ref().reissue_after_unix,
                    &ack.get_ref().signing_ca,
                );
            }
            Err(status) => {
                metrics::count(&agent.metrics.reports, &format!("{:?}", status.code()));
                tracing::warn!(code = ?status.code(), message = status.message(), "report refused");
            }
        }
    }
}

/// A thaw record as the report carries it.
fn thaw_report(record: &crate::freeze::Thawed) -> custody_proto::report::ThawReport {
    let owner = record.owner.clone().unwrap_or_default();
    custody_proto::report::ThawReport {
        namespace: owner.namespace,
        backup_name: owner.backup,
        backup_uid: owner.backup_uid,
        claim_name: owner.claim,
        device: record.device.clone(),
        thawer: record.thawer.clone(),
        frozen_at_unix_nanos: record.frozen_at_unix_nanos,
        thawed_at_unix_nanos: record.thawed_at_unix_nanos,
        max_seconds: record.max_seconds,
        id: record.id.clone(),
    }
}

fn clamp(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}

/// A few exchanges; keeps the best of them and forgets samples older than the window.
async fn measure(
    agent: &Agent,
    client: &mut AgentReportClient<Channel>,
    samples: &mut VecDeque<(Instant, Sample, i64)>,
) {
    for _ in 0..EXCHANGES_PER_MEASUREMENT {
        let node_sent = now_unix_nanos();
        let answer = client
            .exchange_clock(ClockRequest {
                node_sent_unix_nanos: node_sent,
            })
            .await;
        let node_received = now_unix_nanos();
        let answer = match answer {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                tracing::debug!(code = ?status.code(), message = status.message(), "clock exchange failed");
                return;
            }
        };
        let exchange = Exchange {
            node_sent: node_sent.into(),
            controller_received: answer.controller_received_unix_nanos.into(),
            controller_sent: answer.controller_sent_unix_nanos.into(),
            node_received: node_received.into(),
        };
        match exchange.sample() {
            Ok(sample) => {
                samples.push_back((Instant::now(), sample, answer.controller_sent_unix_nanos))
            }
            Err(error) => tracing::warn!(%error, "clock exchange discarded"),
        }
    }
    let window = agent.options.clock_window;
    while samples
        .front()
        .is_some_and(|(taken, _, _)| taken.elapsed() > window)
    {
        samples.pop_front();
    }
    if let Some(best) = best_sample(samples.iter().map(|(_, sample, _)| *sample)) {
        agent
            .metrics
            .clock_offset_seconds
            .set(best.offset_nanos as f64 / 1e9);
        agent
            .metrics
            .clock_round_trip_seconds
            .set(best.round_trip_nanos as f64 / 1e9);
        tracing::debug!(
            offset_nanos = clamp(best.offset_nanos),
            round_trip_nanos = clamp(best.round_trip_nanos),
            "clock measured"
        );
    }
}

fn volume_reports(view: &NodeView) -> Vec<VolumeReport> {
    view.gated
        .values()
        .flat_map(|pod| &pod.volumes)
        .map(|volume| VolumeReport {
            namespace: volume.volume.namespace.clone(),
            pod_name: volume.volume.pod_name.clone(),
            pod_uid: volume.volume.pod_uid.clone(),
            volume: volume.volume.volume.clone(),
            claim_name: volume.volume.claim_name.clone(),
            restore_uid: volume.volume.restore_uid.clone(),
            state: wire_state(&volume.state) as i32,
            reason: match &volume.state {
                State::Failed { reason, .. } => reason.to_string(),
                _ => String::new(),
            },
            message: volume.message.clone(),
        })
        .collect()
}

/// Keeps [`Agent::report_trust`] current: from the ConfigMap `--report-ca-config-map` names
/// (watched), else from the file `--report-ca` (read every 5 s). Runs until the agent stops.
pub async fn follow_trust(agent: Arc<Agent>) {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::WatchStreamExt;
    let set = |pem: Option<Vec<u8>>| {
        agent.report_trust.send_if_modified(|current| {
            if *current != pem {
                *current = pem;
                true
            } else {
                false
            }
        });
    };
    if let Some(config_map) = agent.options.report_ca_config_map.clone() {
        let Some((namespace, name)) = config_map.split_once('/') else {
            tracing::error!(config_map, "--report-ca-config-map is not namespace/name");
            return futures::future::pending().await;
        };
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(agent.client.clone(), namespace);
        let config =
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(
            kube::runtime::watcher(api, config)
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = events.next().await {
            match event {
                Ok(found) => {
                    let pem = found
                        .data
                        .and_then(|mut data| data.remove("ca.crt"))
                        .filter(|pem| !pem.is_empty())
                        .map(String::into_bytes);
                    if pem.is_none() {
                        tracing::warn!(config_map, "no ca.crt in the CA ConfigMap");
                    }
                    set(pem);
                }
                Err(error) => tracing::warn!(config_map, %error, "watching the CA ConfigMap"),
            }
        }
        return;
    }
    let Some(path) = agent.options.report_ca.clone() else {
        return futures::future::pending().await;
    };
    loop {
        set(std::fs::read(&path).ok());
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    }
}
