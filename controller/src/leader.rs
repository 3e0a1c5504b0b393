//! Leader election: of the controller's replicas, one runs the reconcilers at a time; every
//! replica serves the webhook and the report service. The leader holds a
//! `coordination.k8s.io` Lease (`--leader-election-lease`, in the Lease namespace) and renews
//! it every `renew` seconds; a replica takes it over once the record has not changed for a
//! whole lease duration by its own clock (observed time, not the record's timestamps: clocks
//! of two nodes may differ). A leader whose renewal has not succeeded within two thirds of the
//! duration after the last one was sent (every request bounded by that deadline) exits at
//! once, without waiting for anything it started (the kubelet restarts it as a follower): a
//! third of the duration before any follower may take over. On SIGTERM the leader gives the
//! Lease up once its reconcilers stopped, and the other replica takes over at once.
//!
//! Why not a crate: kube-lease-manager (maintained) does this, but adds its own dependency
//! tree for ~150 lines whose decision is a pure function here ([`decide`], table-tested).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::error::{Error, Result};

/// How [`lead`] works.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub lease: String,
    /// This replica's name in the Lease (its pod name).
    pub identity: String,
    /// How long a record that does not change keeps others from taking over.
    pub duration: Duration,
    /// How often the leader renews.
    pub renew: Duration,
}

/// What a replica does about the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, or its holder stopped renewing: take it.
    Take,
    /// This replica holds it: renew.
    Renew,
    /// Another replica holds it and renews: wait.
    Wait { holder: String },
}

/// The decision (pure): `holder` as the Lease names it, `unchanged_for` how long this
/// replica has seen the same record.
pub fn decide(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    duration: Duration,
) -> Decision {
    match holder.filter(|holder| !holder.is_empty()) {
        None => Decision::Take,
        Some(holder) if holder == me => Decision::Renew,
        Some(_) if unchanged_for >= duration => Decision::Take,
        Some(holder) => Decision::Wait {
            holder: holder.to_string(),
        },
    }
}

/// This process's name in the Lease: its pod's name and when it started, `<pod>_<hex>`. A
/// restarted container is another process: it waits like any replica, while the record of
/// the one before it ages.
pub fn identity(pod: Option<&str>) -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!(
        "{}_{started:x}",
        pod.filter(|pod| !pod.is_empty())
            .unwrap_or("custody-controller")
    )
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// The Lease held by `identity`, from `current` (a new one when there is none).
fn held(current: Option<&Lease>, settings: &Settings, taking: bool) -> Lease {
    let mut lease = current.cloned().unwrap_or_else(|| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(settings.lease.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "custody".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: None,
    });
    let mut spec = lease.spec.take().unwrap_or_default();
    if taking {
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds = Some(settings.duration.as_secs().max(1) as i32);
    spec.renew_time = Some(now());
    lease.spec = Some(spec);
    lease
}

/// Writes `lease` (created when `exists` is false, else replaced at its resourceVersion).
async fn write(api: &Api<Lease>, lease: &Lease, exists: bool) -> kube::Result<Lease> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    if exists {
        api.replace(&name, &PostParams::default(), lease).await
    } else {
        api.create(&PostParams::default(), lease).await
    }
}

/// Waits until this replica holds the Lease, saying once whom it waits for; returns when the
/// write that took it was sent.
async fn acquire(api: &Api<Lease>, settings: &Settings) -> Instant {
    // The record as last seen: (resourceVersion, since when, by this replica's clock).
    let mut seen: Option<(String, Instant)> = None;
    let mut waiting_for: Option<String> = None;
    loop {
        match api.get_opt(&settings.lease).await {
            Ok(current) => {
                let version = current
                    .as_ref()
                    .and_then(|lease| lease.metadata.resource_version.clone())
                    .unwrap_or_default();
                let since = match &seen {
                    Some((seen_version, since)) if *seen_version == version => *since,
                    _ => {
                        let since = Instant::now();
                        seen = Some((version, since));
                        since
                    }
                };
                let spec = current.as_ref().and_then(|lease| lease.spec.as_ref());
                let holder = spec.and_then(|spec: &LeaseSpec| spec.holder_identity.clone());
                // The holder's own duration counts when longer (a rollout changing it).
                let recorded = spec
                    .and_then(|spec| spec.lease_duration_seconds)
                    .map(|seconds| Duration::from_secs(seconds.max(0) as u64))
                    .unwrap_or_default();
                match decide(
                    holder.as_deref(),
                    &settings.identity,
                    since.elapsed(),
                    settings.duration.max(recorded),
                ) {
                    Decision::Wait { holder } => {
                        if waiting_for.as_deref() != Some(holder.as_str()) {
                            tracing::info!(
                                lease = settings.lease,
                                holder,
                                "another replica leads; this one serves the webhook and the report service and waits to lead"
                            );
                            waiting_for = Some(holder);
                        }
                    }
                    decision => {
                        let taking = decision == Decision::Take;
                        let lease = held(current.as_ref(), settings, taking);
                        let sent = Instant::now();
                        match write(api, &lease, current.is_some()).await {
                            Ok(_) => {
                                tracing::info!(
                                    lease = settings.lease,
                                    identity = settings.identity,
                                    previous = holder.as_deref().unwrap_or(""),
                                    "leading: the reconcilers start"
                                );
                                return sent;
                            }
                            // Another replica wrote first: look again.
                            Err(kube::Error::Api(status)) if status.code == 409 => continue,
                            Err(error) => {
                                tracing::warn!(lease = settings.lease, %error, "taking the leader Lease")
                            }
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(lease = settings.lease, %error, "reading the leader Lease")
            }
        }
        tokio::time::sleep(settings.renew.min(Duration::from_secs(2))).await;
    }
}

/// Renews the Lease until it cannot. Each renewal must succeed within two thirds of the
/// duration after the last successful one was *sent* (the record others see can be no older
/// than that), every request bounded by that deadline (an API server that stops answering
/// does not keep this replica leading); past it, or once another replica holds the Lease,
/// returns the error, a third of the duration before any follower may take over.
/// `taken` is when the write that took the Lease was sent.
async fn keep(api: &Api<Lease>, settings: &Settings, taken: Instant) -> Error {
    let mut sent_ok = taken;
    let mut pause = settings.renew;
    loop {
        tokio::time::sleep(pause).await;
        let deadline = sent_ok + settings.duration * 2 / 3;
        let sent = Instant::now();
        let attempt = async {
            let current = api.get(&settings.lease).await?;
            let holder = current
                .spec
                .as_ref()
                .and_then(|spec| spec.holder_identity.clone());
            if holder.as_deref() != Some(settings.identity.as_str()) {
                return Ok(Err(holder.unwrap_or_default()));
            }
            write(api, &held(Some(&current), settings, false), true)
                .await
                .map(Ok)
        };
        match tokio::time::timeout_at(deadline.into(), attempt).await {
            Ok(Ok(Ok(_))) => {
                sent_ok = sent;
                pause = settings.renew;
            }
            Ok(Ok(Err(holder))) => {
                return Error::LeadershipLost(format!(
                    "Lease {}/{} is held by {holder:?}",
                    settings.namespace, settings.lease
                ));
            }
            Ok(Err(error)) => {
                // A conflict or a failure of the moment: again soon, within the deadline.
                tracing::warn!(lease = settings.lease, %error, "renewing the leader Lease");
                pause = Duration::from_secs(1);
            }
            Err(_) => {
                return Error::LeadershipLost(format!(
                    "Lease {}/{} not renewed within {:?} of the last renewal",
                    settings.namespace,
                    settings.lease,
                    settings.duration * 2 / 3
                ));
            }
        }
        if Instant::now() >= deadline {
            return Error::LeadershipLost(format!(
                "Lease {}/{} not renewed within {:?} of the last renewal",
                settings.namespace,
                settings.lease,
                settings.duration * 2 / 3
            ));
        }
    }
}

/// Gives the Lease up (this replica stops): the other replica need not wait out its
/// duration.
async fn release(api: &Api<Lease>, settings: &Settings) {
    let Ok(mut current) = api.get(&settings.lease).await else {
        return;
    };
    let spec = current.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    match api
        .replace(&settings.lease, &PostParams::default(), &current)
        .await
    {
        Ok(_) => tracing::info!(lease = settings.lease, "leader Lease given up"),
        Err(error) => tracing::warn!(lease = settings.lease, %error, "giving up the leader Lease"),
    }
}

/// Runs `work` while this replica leads: waits for the Lease (until `stopped`), then runs
/// `work` and renews until `work` ends (the process stops: the Lease is given up) or
/// leadership is lost (an error: the process exits). `leading` says which.
pub async fn lead(
    client: Client,
    settings: Settings,
    leading: std::sync::Arc<std::sync::atomic::AtomicBool>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    work: impl Future<Output = ()>,
    stopped: impl Future<Output = ()>,
) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let taken = tokio::select! {
        taken = acquire(&api, &settings) => taken,
        // Stopped before it ever led.
        () = stopped => return Ok(()),
    };
    leading.store(true, std::sync::atomic::Ordering::Relaxed);
    metrics.leader.set(1);
    let outcome = tokio::select! {
        () = work => Ok(()),
        lost = keep(&api, &settings, taken) => Err(lost),
    };
    leading.store(false, std::sync::atomic::Ordering::Relaxed);
    metrics.leader.set(0);
    if outcome.is_ok() {
        release(&api, &settings).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let lease = Duration::from_secs(15);
        let rows = [
            ("nobody holds it", None, Duration::ZERO, Decision::Take),
            ("given up", Some(""), Duration::ZERO, Decision::Take),
            ("this replica", Some("me"), Duration::ZERO, Decision::Renew),
            (
                "this replica, even unchanged for long",
                Some("me"),
                Duration::from_secs(60),
                Decision::Renew,
            ),
            (
                "another, renewing",
                Some("other"),
                Duration::from_secs(14),
                Decision::Wait {
                    holder: "other".into(),
                },
            ),
            (
                "another, silent for a whole lease",
                Some("other"),
                Duration::from_secs(15),
                Decision::Take,
            ),
        ];
        for (name, holder, unchanged, expected) in rows {
            assert_eq!(decide(holder, "me", unchanged, lease), expected, "{name}");
        }
    }
}
