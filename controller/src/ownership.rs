//! Whose object is it: the one check made before every destructive call. An object belongs
//! to an owner only when its controller owner reference names that owner's kind and UID
//! **and** its label carries the same UID. A look-alike (same labels, another owner; same
//! owner reference, no label) is somebody else's and is never touched.

use kube::api::ObjectMeta;

use custody_kube::api::{GROUP, VERSION};

/// Labels from `(key, value)` pairs.
pub fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// The owner reference that makes `owner` the controller of what custody creates for it,
/// blocking its deletion until the owned object is gone.
pub fn controller_reference<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    owner.controller_owner_ref(&()).map(|mut reference| {
        reference.block_owner_deletion = Some(true);
        reference
    })
}

/// Whether `meta`'s controller reference names the object of `api_version` and `kind` with
/// `uid` (never an empty UID).
fn controller_is(meta: &ObjectMeta, api_version: &str, kind: &str, uid: &str) -> bool {
    !uid.is_empty()
        && meta
            .owner_references
            .iter()
            .flatten()
            .find(|owner| owner.controller == Some(true))
            .is_some_and(|owner| {
                owner.kind == kind && owner.api_version == api_version && owner.uid == uid
            })
}

/// Whether `meta` is owned by the custody object of `kind` with `uid`, as a controller
/// reference and by the label `label`.
pub fn owned_by(meta: &ObjectMeta, kind: &str, uid: &str, label: &str) -> bool {
    let label_matches = meta
        .labels
        .as_ref()
        .and_then(|labels| labels.get(label))
        .is_some_and(|value| value == uid);
    controlled_by(meta, kind, uid) && label_matches
}

/// Whether `meta` names the custody object of `kind` with `uid` as its controller, without
/// a label (for objects whose labels belong to their user, such as a Restore).
pub fn controlled_by(meta: &ObjectMeta, kind: &str, uid: &str) -> bool {
    controller_is(meta, &format!("{GROUP}/{VERSION}"), kind, uid)
}

/// Whether `meta` (a pod) was created by the StatefulSet with `uid`: its controller reference
/// names it.
pub fn created_by_stateful_set(meta: &ObjectMeta, uid: &str) -> bool {
    controller_is(meta, "apps/v1", "StatefulSet", uid)
}

/// Whether `meta` (a pod) was created by the Job with `job_uid`: its controller reference
/// names that Job. Labels such as `job-name` prove nothing; anyone who creates pods sets them.
pub fn created_by_job(meta: &ObjectMeta, job_uid: &str) -> bool {
    controller_is(meta, "batch/v1", "Job", job_uid)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    const LABEL: &str = "custody.io/restore-uid";

    fn meta(owner: Option<(&str, &str, &str, bool)>, label: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            owner_references: owner.map(|(api_version, kind, uid, controller)| {
                vec![OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: "r".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]
            }),
            labels: label.map(|value| [(LABEL.to_string(), value.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn ownership_needs_owner_reference_and_label() {
        let v = "custody.io/v1alpha1";
        let rows: &[(&str, ObjectMeta, &str, bool)] = &[
            (
                "owner and label",
                meta(Some((v, "Restore", "u1", true)), Some("u1")),
                "u1",
                true,
            ),
            (
                "label only: a look-alike",
                meta(None, Some("u1")),
                "u1",
                false,
            ),
            (
                "owner only",
                meta(Some((v, "Restore", "u1", true)), None),
                "u1",
                false,
            ),
            (
                "label of another",
                meta(Some((v, "Restore", "u1", true)), Some("u2")),
                "u1",
                false,
            ),
            (
                "owner of another uid",
                meta(Some((v, "Restore", "u2", true)), Some("u1")),
                "u1",
                false,
            ),
            (
                "owner of another kind",
                meta(Some((v, "Backup", "u1", true)), Some("u1")),
                "u1",
                false,
            ),
            (
                "owner of another group",
                meta(Some(("batch/v1", "Restore", "u1", true)), Some("u1")),
                "u1",
                false,
            ),
            (
                "not the controller",
                meta(Some((v, "Restore", "u1", false)), Some("u1")),
                "u1",
                false,
            ),
            (
                "empty uid never matches",
                meta(Some((v, "Restore", "", true)), Some("")),
                "",
                false,
            ),
        ];
        for (name, meta, uid, expected) in rows {
            assert_eq!(owned_by(meta, "Restore", uid, LABEL), *expected, "{name}");
        }
    }

    #[test]
    fn control_needs_the_controller_reference() {
        let v = "custody.io/v1alpha1";
        assert!(controlled_by(
            &meta(Some((v, "Cluster", "c1", true)), None),
            "Cluster",
            "c1"
        ));
        assert!(!controlled_by(
            &meta(Some((v, "Cluster", "c1", false)), None),
            "Cluster",
            "c1"
        ));
        assert!(!controlled_by(
            &meta(Some((v, "Cluster", "c2", true)), None),
            "Cluster",
            "c1"
        ));
        assert!(!controlled_by(&meta(None, None), "Cluster", "c1"));
        assert!(!controlled_by(
            &meta(Some((v, "Cluster", "", true)), None),
            "Cluster",
            ""
        ));
    }

    #[test]
    fn a_pod_is_a_jobs_only_by_its_controller_reference() {
        let job = "batch/v1";
        let rows = [
            (
                "the Job's pod",
                meta(Some((job, "Job", "j1", true)), None),
                true,
            ),
            (
                "a look-alike with labels only",
                meta(None, Some("j1")),
                false,
            ),
            (
                "another Job's pod",
                meta(Some((job, "Job", "j2", true)), None),
                false,
            ),
            (
                "not the controller",
                meta(Some((job, "Job", "j1", false)), None),
                false,
            ),
            (
                "another kind",
                meta(Some((job, "CronJob", "j1", true)), None),
                false,
            ),
            (
                "another group",
                meta(Some(("custody.io/v1alpha1", "Job", "j1", true)), None),
                false,
            ),
        ];
        for (name, meta, expected) in rows {
            assert_eq!(created_by_job(&meta, "j1"), expected, "{name}");
        }
        assert!(!created_by_job(
            &meta(Some((job, "Job", "", true)), None),
            ""
        ));
    }
}
