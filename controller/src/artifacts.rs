//! Deleting a Backup's artifact, as pure decisions: whether the recorded keys are provably this
//! Backup's own (contested against every other Backup, finished or not), what deleting the
//! Backup does next, and how long a failed delete waits before it is tried again.

use std::time::Duration;

use custody_kube::api::{Artifact, Backup, BackupRepository, DeletionPolicy};
use custody_kube::s3::{Endpoint, Signer};

/// Finalizer of the backup reconciler on Backups: the artifact is dealt with before the Backup
/// goes.
pub const FINALIZER: &str = "custody.io/artifact-cleanup";
/// Finalizer on a repository's credentials Secret while Backups with artifacts still need it.
pub const SECRET_FINALIZER: &str = "custody.io/artifact-credentials";
/// `"true"` releases a Backup without deleting its artifact.
pub const SKIP_ANNOTATION: &str = "custody.io/skip-artifact-cleanup";

/// Another Backup, as the contest sees it.
#[derive(Clone, Debug)]
pub struct Other<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub artifact: Option<&'a Artifact>,
}

/// Where to delete `artifact` and what signs the calls: the repository's current endpoint,
/// CA and credentials (Secret or web identity) while it exists (it may have moved since the
/// backup), the recorded ones once it is gone; always the recorded bucket.
pub fn delete_endpoint(
    artifact: &Artifact,
    repository: Option<&BackupRepository>,
) -> (Endpoint, Signer) {
    let (mut endpoint, signer) = match repository {
        Some(repository) => (
            custody_kube::s3::endpoint_of(repository),
            Signer::of(&repository.spec),
        ),
        None => (
            Endpoint {
                url: artifact.endpoint.clone(),
                region: artifact.region.clone().unwrap_or_default(),
                bucket: String::new(),
                path_style: artifact.force_path_style,
                ca_bundle: artifact
                    .ca_bundle
                    .as_ref()
                    .map(|pem| pem.as_bytes().to_vec()),
                limits: custody_kube::s3::Limits::default(),
                ..Default::default()
            },
            match &artifact.web_identity {
                Some(identity) => Signer::WebIdentity(identity.clone()),
                None => Signer::Secret(artifact.credentials_secret.clone().unwrap_or_default()),
            },
        ),
    };
    endpoint.bucket = artifact.bucket.clone();
    (endpoint, signer)
}

/// The credentials Secrets a Backup may hold the finalizer of: the one recorded with its
/// artifact or its destination, and — for a Backup that held it but was stopped before
/// recording either — its repository's.
pub fn held_secrets(backup: &Backup, repository_secret: Option<&str>) -> Vec<String> {
    let status = backup.status.as_ref();
    let recorded = [
        status
            .and_then(|status| status.artifact.as_ref())
            .and_then(|artifact| artifact.credentials_secret.clone()),
        status
            .and_then(|status| status.destination.as_ref())
            .and_then(|destination| destination.credentials_secret.clone()),
    ];
    let mut secrets: Vec<String> = recorded.into_iter().flatten().collect();
    if secrets.is_empty() {
        secrets.extend(repository_secret.map(str::to_string));
    }
    secrets.sort();
    secrets.dedup();
    secrets
}

/// A Backup's cleanup status as recorded (the default before its deletion wrote any).
pub fn cleanup_of(backup: &Backup) -> custody_kube::api::CleanupStatus {
    backup
        .status
        .as_ref()
        .and_then(|status| status.cleanup.clone())
        .unwrap_or_default()
}

/// Whether `other` still needs Secret `secret`: it holds the cleanup finalizer, its cleanup is
/// not done, and it recorded that Secret — or it recorded nothing yet and is not finished (it
/// may have held the Secret a moment before recording it). A run that recorded a web identity
/// needs none.
pub fn needs_secret(other: &Backup, secret: &str) -> bool {
    use custody_kube::api::BackupPhase;
    let holds = other
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    let status = other.status.as_ref();
    if !holds || cleanup_of(other).done {
        return false;
    }
    let recorded = held_secrets(other, None);
    if !recorded.is_empty() {
        return recorded.iter().any(|name| name == secret);
    }
    // A run signed by a web identity recorded that, and holds no Secret.
    let signs_without_secret = status.is_some_and(|status| {
        status
            .artifact
            .as_ref()
            .is_some_and(|artifact| artifact.web_identity.is_some())
            || status
                .destination
                .as_ref()
                .is_some_and(|destination| destination.service_account.is_some())
    });
    if signs_without_secret {
        return false;
    }
    !matches!(
        status.and_then(|status| status.phase),
        Some(BackupPhase::Completed | BackupPhase::Failed)
    )
}

/// The outcome of contesting the recorded keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contest {
    /// The keys are this Backup's own: delete them.
    Proven { keys: Vec<String> },
    /// Not provably its own: nothing is deleted.
    Refused {
        reason: &'static str,
        message: String,
    },
}

/// Whether `key` is in normal form: not empty, no leading slash, and no empty, `.` or `..`
/// segment. custody records and deletes only keys in normal form: a server or proxy that
/// normalises paths could otherwise take one key for another.
pub fn normal_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// The form two keys are compared in: percent-escapes decoded, empty and `.` segments
/// dropped, `..` segments applied. Two keys that differ only in such spelling clash.
pub fn comparable(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|byte| (*byte as char).to_digit(16));
        match (bytes[index], hex(index + 1), hex(index + 2)) {
            (b'%', Some(high), Some(low)) => {
                decoded.push((high * 16 + low) as u8);
                index += 3;
            }
            (byte, _, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    segments.join("/")
}

fn under(key: &str, prefix: &str) -> bool {
    let (key, prefix) = (comparable(key), comparable(prefix));
    !prefix.is_empty() && key.starts_with(&format!("{prefix}/"))
}

/// The keys custody wrote for this Backup are under a prefix that ends with its UID; no other
/// Backup — finished or not, in any namespace, of the same bucket — may have recorded the same
/// keys, a prefix that holds them, or keys under this Backup's prefix.
pub fn contest(mine: &Artifact, uid: &str, others: &[Other<'_>]) -> Contest {
    let keys = [mine.key.clone(), mine.manifest_key.clone()];
    let own_prefix =
        !uid.is_empty() && (mine.prefix == uid || mine.prefix.ends_with(&format!("/{uid}")));
    if let Some(key) = keys.iter().find(|key| !normal_key(key)) {
        return Contest::Refused {
            reason: "KeyNotNormal",
            message: format!(
                "the recorded key {key} is not in normal form (an empty, . or .. segment); nothing is deleted"
            ),
        };
    }
    if !own_prefix || keys.iter().any(|key| !under(key, &mine.prefix)) {
        return Contest::Refused {
            reason: "KeyNotProvenOwn",
            message: format!(
                "the recorded keys {} and {} are not under a prefix ending with this Backup's UID {uid}",
                mine.key, mine.manifest_key
            ),
        };
    }
    for other in others {
        if other.uid == uid {
            continue;
        }
        let Some(theirs) = other.artifact else {
            continue;
        };
        if theirs.bucket != mine.bucket {
            continue;
        }
        let their_keys = [comparable(&theirs.key), comparable(&theirs.manifest_key)];
        let clash = keys
            .iter()
            .any(|key| their_keys.contains(&comparable(key)) || under(key, &theirs.prefix))
            || [&theirs.key, &theirs.manifest_key]
                .iter()
                .any(|key| under(key, &mine.prefix));
        if clash {
            return Contest::Refused {
                reason: "KeyClaimedByAnother",
                message: format!(
                    "Backup {}/{} (UID {}) also records keys in {} under {}; nothing is deleted",
                    other.namespace, other.name, other.uid, mine.bucket, mine.prefix
                ),
            };
        }
    }
    Contest::Proven {
        keys: keys.to_vec(),
    }
}

/// The contest of a snapshot (format 2): the snapshot file `snapshots/<id>` in the repository
/// is this Backup's to forget when its ID was recorded from the report of this Backup's own
/// Job (a snapshot file's name is the SHA-256 of its content: no other file can have it), the
/// snapshot was written by this Kubernetes cluster (`here`, the UID of its `kube-system`), and
/// no other Backup, in any namespace, records the same snapshot. Forgetting deletes that one
/// file; the blocks it used stay until a prune finds no snapshot uses them.
pub fn contest_snapshot(
    mine: &Artifact,
    here: Option<&str>,
    uid: &str,
    others: &[Other<'_>],
) -> Contest {
    let Some(snapshot) = &mine.snapshot else {
        return Contest::Refused {
            reason: "KeyNotProvenOwn",
            message: "no snapshot was recorded".to_string(),
        };
    };
    let Some(id) = &snapshot.id else {
        // The run wrote no snapshot: nothing to forget.
        return Contest::Proven { keys: Vec::new() };
    };
    if id.len() != 64 || !id.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Contest::Refused {
            reason: "KeyNotNormal",
            message: format!(
                "the recorded snapshot {id:?} is not a snapshot ID; nothing is deleted"
            ),
        };
    }
    if here != Some(snapshot.origin_cluster.as_str()) {
        return Contest::Refused {
            reason: "SnapshotOfAnotherCluster",
            message: format!(
                "snapshot {id} was written by the Kubernetes cluster whose kube-system namespace has UID {}, not by this one: only that cluster forgets it; it is kept",
                snapshot.origin_cluster
            ),
        };
    }
    for other in others {
        if other.uid == uid {
            continue;
        }
        let Some(theirs) = other
            .artifact
            .and_then(|artifact| artifact.snapshot.as_ref())
        else {
            continue;
        };
        if theirs.id.as_deref() == Some(id.as_str())
            && theirs.repository_id == snapshot.repository_id
        {
            return Contest::Refused {
                reason: "KeyClaimedByAnother",
                message: format!(
                    "Backup {}/{} (UID {}) also records snapshot {id}; nothing is deleted",
                    other.namespace, other.name, other.uid
                ),
            };
        }
    }
    Contest::Proven {
        keys: vec![format!(
            "{}/snapshots/{id}",
            mine.prefix.trim_end_matches('/')
        )],
    }
}

/// The contest of a dump attributed to a command backup: the attribution is made again with
/// the runs as they are now (another run of the prefix, finished or not, that could have
/// written the dump, or that recorded it, refuses it).
pub fn contest_attributed(
    mine: &Artifact,
    run: &crate::attribution::Run,
    others: &[crate::attribution::OtherRun],
) -> Contest {
    let Some(evidence) = &mine.attribution else {
        return Contest::Refused {
            reason: "KeyNotProvenOwn",
            message: format!("{} was never attributed to this Backup", mine.key),
        };
    };
    if !normal_key(&mine.key) || !under(&mine.key, &mine.prefix) {
        return Contest::Refused {
            reason: "KeyNotProvenOwn",
            message: format!(
                "the recorded dump {} is not a key in normal form under the command's prefix {}/",
                mine.key, mine.prefix
            ),
        };
    }
    let candidate = crate::attribution::Candidate {
        key: mine.key.clone(),
        last_modified: evidence.last_modified_nanos,
    };
    // With one candidate, an attribution can only name that candidate.
    match crate::attribution::attribute(run, &[candidate], others) {
        Ok(_) => Contest::Proven {
            keys: vec![mine.key.clone()],
        },
        Err(refusal) => Contest::Refused {
            reason: refusal.reason,
            message: refusal.message,
        },
    }
}

/// What deleting a Backup does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not this reconciler's to do (its finalizer is gone).
    Nothing,
    /// A Restore that is not over reads this Backup: the deletion waits.
    Wait { message: String },
    /// Release the Backup without deleting anything; `warning` when that is not what the user
    /// asked for (the keys could not be proven its own).
    Release {
        reason: &'static str,
        message: String,
        warning: bool,
    },
    /// Delete these keys, then release the Backup.
    Delete { keys: Vec<String> },
}

/// Facts about a Backup being deleted.
#[derive(Clone, Debug)]
pub struct Deleting<'a> {
    pub has_finalizer: bool,
    /// `status.cleanup.done`: an earlier step dealt with the artifact (deleted, kept or found
    /// nothing to delete) and may have released the credentials Secret already; only the
    /// Backup's own finalizer is left to remove.
    pub done: bool,
    /// The skip annotation is `"true"`.
    pub skip: bool,
    pub policy: DeletionPolicy,
    pub artifact: Option<&'a Artifact>,
    /// Restores that are not over and read this Backup.
    pub readers: &'a [String],
    /// The contest of the recorded keys (only asked when needed).
    pub contest: Option<Contest>,
}

/// The order matters: a finished cleanup only releases; a reading restore holds everything (its agent still needs the Backup's
/// manifest hash); then the user's explicit choices; then proof.
pub fn step(facts: &Deleting<'_>) -> Step {
    if !facts.has_finalizer {
        return Step::Nothing;
    }
    // A step stopped between releasing the Secret and removing the finalizer (a restart, a
    // lost write) must not need the Secret again: it may be gone with its namespace.
    if facts.done {
        return Step::Release {
            reason: "CleanupDone",
            message: "the artifact was already dealt with: releasing the Backup".to_string(),
            warning: false,
        };
    }
    if let Some(reader) = facts.readers.first() {
        return Step::Wait {
            message: format!(
                "Restore {reader} reads this Backup; it is deleted once the restore ends"
            ),
        };
    }
    if facts.skip {
        return Step::Release {
            reason: "ArtifactKept",
            message: format!("{SKIP_ANNOTATION} is set: the artifact is kept"),
            warning: false,
        };
    }
    let Some(artifact) = facts.artifact else {
        return Step::Release {
            reason: "NoArtifact",
            message: "no artifact was recorded: nothing to delete".to_string(),
            warning: false,
        };
    };
    if facts.policy == DeletionPolicy::Retain {
        return Step::Release {
            reason: "ArtifactKept",
            message: format!("deletionPolicy Retain: {} is kept", artifact.key),
            warning: false,
        };
    }
    match &facts.contest {
        Some(Contest::Proven { keys }) if keys.is_empty() => Step::Release {
            reason: "NoArtifact",
            message: "the run wrote no snapshot: nothing to forget".to_string(),
            warning: false,
        },
        Some(Contest::Proven { keys }) => Step::Delete { keys: keys.clone() },
        Some(Contest::Refused { reason, message }) => Step::Release {
            reason,
            message: message.clone(),
            warning: true,
        },
        None => Step::Release {
            reason: "KeyNotProvenOwn",
            message: "the keys were not contested".to_string(),
            warning: true,
        },
    }
}

/// How long the `attempts`-th failed delete waits: 5 s doubling, at most 5 minutes.
pub fn backoff(attempts: u32) -> Duration {
    let seconds = 5u64.saturating_mul(1u64 << attempts.min(16));
    Duration::from_secs(seconds.min(300))
}

/// How long a Backup whose delete failed `attempts` times, last at `last_attempt` (Unix
/// seconds), still waits at `now`: its own status carries the backoff, so a change to the
/// Backup (its own status written, an annotation) never brings the next attempt forward.
pub fn wait_before_retry(attempts: u32, last_attempt: Option<i64>, now: i64) -> Option<Duration> {
    let last = last_attempt?;
    if attempts == 0 {
        return None;
    }
    let due = last.saturating_add(backoff(attempts - 1).as_secs() as i64);
    (due > now).then(|| Duration::from_secs((due - now) as u64))
}

#[cfg(test)]
mod tests;
