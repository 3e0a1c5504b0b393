//! Which pods a Restore's reports speak for, which pods may be released, which claims to
//! record as verified, and what cancelling a Restore deletes: the decisions about pods and
//! Jobs, as plain data.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use super::owned_job;
use custody_kube::api::{ReportedVolume, VolumeRestoreStatus, VolumeState};

/// The reports about this Restore's claims, one per claim: the newest pod wins when two
/// report the same claim (a replaced pod), keyed by claim. Reports about other Restores or
/// namespaces, or about claims the Restore does not write, are ignored.
pub fn reports_for<'a>(
    agents: impl IntoIterator<Item = (&'a str, &'a [ReportedVolume])>,
    namespace: &str,
    restore_uid: &str,
    claims: &[String],
) -> BTreeMap<String, (&'a ReportedVolume, &'a str)> {
    let wanted: BTreeSet<&str> = claims.iter().map(String::as_str).collect();
    let mut found: BTreeMap<String, (&'a ReportedVolume, &'a str)> = BTreeMap::new();
    for (node, volumes) in agents {
        for volume in volumes {
            if volume.namespace != namespace
                || volume.restore_uid != restore_uid
                || !wanted.contains(volume.claim_name.as_str())
            {
                continue;
            }
            // Of two reports, the more advanced one is kept: a second pod of the same claim
            // is a replacement, and its volume is the same.
            let rank = |state: VolumeState| match state {
                VolumeState::Pending => 0,
                VolumeState::Restoring => 1,
                VolumeState::Verifying => 2,
                VolumeState::Verified => 3,
                VolumeState::Failed => 4,
            };
            match found.get(&volume.claim_name) {
                Some((existing, _)) if rank(existing.state) >= rank(volume.state) => {}
                _ => {
                    found.insert(volume.claim_name.clone(), (volume, node));
                }
            }
        }
    }
    found
}

/// Whether the agent of `node` may speak for the pod `volume` names: a pod of that name and
/// UID, read from the API server, is bound to `node`. An agent's token proves only which node
/// it runs on; what it says about pods elsewhere is ignored.
pub fn speaks_for(node: &str, volume: &ReportedVolume, pods: &[Pod]) -> bool {
    pods.iter().any(|pod| {
        pod.metadata.name.as_deref() == Some(volume.pod_name.as_str())
            && pod.metadata.namespace.as_deref() == Some(volume.namespace.as_str())
            && pod.metadata.uid.as_deref() == Some(volume.pod_uid.as_str())
            && !volume.pod_uid.is_empty()
            && pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(node)
    })
}

/// The pods the agents report volumes of under this Restore, by name.
pub fn reported_pods<'a>(
    agents: impl IntoIterator<Item = (&'a str, &'a [ReportedVolume])>,
    namespace: &str,
    restore_uid: &str,
) -> BTreeSet<String> {
    agents
        .into_iter()
        .flat_map(|(_, volumes)| volumes)
        .filter(|volume| volume.namespace == namespace && volume.restore_uid == restore_uid)
        .map(|volume| volume.pod_name.clone())
        .collect()
}

/// The pods whose every volume under this Restore is Verified, by name: their readiness gate
/// may be set.
pub fn releasable_pods(
    reports: &BTreeMap<String, (&ReportedVolume, &str)>,
    claims: &[String],
) -> BTreeSet<String> {
    let mut pods: BTreeMap<&str, bool> = BTreeMap::new();
    for (volume, _) in reports.values() {
        let verified = volume.state == VolumeState::Verified;
        pods.entry(volume.pod_name.as_str())
            .and_modify(|all| *all &= verified)
            .or_insert(verified);
    }
    pods.into_iter()
        .filter(|(_, verified)| *verified)
        // Every claim of the pod (`<template>-<pod>`) reported, not only those seen so far.
        .filter(|(pod, _)| {
            let suffix = format!("-{pod}");
            claims
                .iter()
                .filter(|claim| claim.ends_with(&suffix))
                .all(|claim| reports.contains_key(claim))
        })
        .map(|(pod, _)| pod.to_string())
        .collect()
}

/// The claims a Restore's status records as verified: each gets that Restore's record on the
/// claim (see [`needs_record`]) before the Restore can go, so that a pod still carrying
/// `custody-wait` for it is released later without it, and only on that claim.
pub fn verified_claims(volumes: &[VolumeRestoreStatus]) -> Vec<String> {
    volumes
        .iter()
        .filter(|volume| volume.state == VolumeState::Verified)
        .map(|volume| volume.claim_name.clone())
        .collect()
}

/// Whether a verified claim with `annotations` (`None`: the claim is gone) still needs the
/// marks of Restore `restore_uid`: the known-data mark and the Restore's own record.
pub fn needs_record(annotations: Option<&BTreeMap<String, String>>, restore_uid: &str) -> bool {
    annotations.is_some_and(|annotations| {
        !annotations.contains_key(custody_proto::names::ANNOTATION_KNOWN_DATA)
            || !annotations.contains_key(&custody_proto::names::verified_by_restore(restore_uid))
    })
}

/// What cancelling a Restore still has to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Teardown {
    /// This Restore's Jobs to delete now.
    pub delete: Vec<String>,
    /// Whether anything of this Restore is still there (Jobs, or their pods).
    pub waiting: bool,
}

/// Teardown of a Restore: delete only Jobs it owns (not those already going), and wait until
/// they and their pods are gone before the finalizer is removed. A pod counts only when its
/// controller is one of those Jobs: a look-alike's pods never hold the teardown.
pub fn teardown(jobs: &[Job], pods: &[Pod], restore_uid: &str) -> Teardown {
    let owned: Vec<&Job> = jobs
        .iter()
        .filter(|job| owned_job(job, restore_uid))
        .collect();
    let owned_uids: BTreeSet<&str> = owned
        .iter()
        .filter_map(|job| job.metadata.uid.as_deref())
        .collect();
    let pods_left = pods.iter().any(|pod| {
        owned_uids
            .iter()
            .any(|uid| crate::ownership::created_by_job(&pod.metadata, uid))
    });
    let delete = owned
        .iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
        .filter_map(|job| job.metadata.name.clone())
        .collect();
    Teardown {
        delete,
        waiting: !owned.is_empty() || pods_left,
    }
}
