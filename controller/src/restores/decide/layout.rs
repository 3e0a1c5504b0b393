//! Which claims a Restore writes, and from which of the Backup's volumes: the Backup's volumes
//! matched with the Cluster's volume claim templates, pod by pod.

use std::collections::BTreeSet;

/// Why a Restore cannot start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// Refused: the Backup's volumes and the Cluster's volume claim templates do not match.
pub const UNSUPPORTED_VOLUME_LAYOUT: &str = "UnsupportedVolumeLayout";

/// Which volume of the Backup each of the Cluster's volume claim templates gets, in the
/// Cluster's order: a Backup of one volume restores into a Cluster of one template whatever
/// their names; a Backup of several restores only into a Cluster with the same templates
/// (by name), since restoring some of them would start the application on partly empty data
/// and leaving one out would lose it.
pub fn layout(
    templates: &[String],
    backup_volumes: &[String],
) -> Result<Vec<(String, String)>, Refusal> {
    if let ([template], [volume]) = (templates, backup_volumes) {
        return Ok(vec![(template.clone(), volume.clone())]);
    }
    let wanted: BTreeSet<&String> = templates.iter().collect();
    let held: BTreeSet<&String> = backup_volumes.iter().collect();
    if wanted.len() != templates.len() || held != wanted || backup_volumes.len() != held.len() {
        return Err(Refusal {
            reason: UNSUPPORTED_VOLUME_LAYOUT,
            message: format!(
                "the Backup holds {} ({}) and the Cluster lists volume claim templates {}: a Backup of several volumes restores into the templates of the same names, all of them, so that the application never starts on partly empty data",
                if backup_volumes.len() == 1 {
                    "one volume"
                } else {
                    "volumes"
                },
                backup_volumes.join(", "),
                if templates.is_empty() {
                    "none".to_string()
                } else {
                    templates.join(", ")
                },
            ),
        });
    }
    Ok(templates
        .iter()
        .map(|template| (template.clone(), template.clone()))
        .collect())
}

/// The claims a Restore writes, pod by pod: for every replica of the StatefulSet, the claim
/// of each template of the `layout` (`<template>-<statefulset>-<ordinal>`), with the volume
/// of the Backup it gets.
pub fn claims(
    layout: &[(String, String)],
    stateful_set: &str,
    replicas: i32,
) -> Result<Vec<(String, String)>, Refusal> {
    if replicas < 1 {
        return Err(Refusal {
            reason: "NoReplicas",
            message: format!("StatefulSet {stateful_set} has no replicas to restore"),
        });
    }
    Ok((0..replicas)
        .flat_map(|ordinal| {
            layout.iter().map(move |(template, volume)| {
                (
                    format!("{template}-{stateful_set}-{ordinal}"),
                    volume.clone(),
                )
            })
        })
        .collect())
}
