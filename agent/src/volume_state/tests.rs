use super::*;

/// What is known of the Restores when the test's Restore is in the agent's watch.
fn watched(recorded: Recorded) -> Restores {
    Restores {
        recorded,
        watched: [("db".to_string(), "restore-uid".to_string())].into(),
        absences: Absences::new(),
    }
}

/// The test's workload volume: pod `db/pg-0`, claim `data-pg-0`, Restore `pg-restore`
/// (`restore-uid`); also the agent's state tests'.
pub(crate) fn volume() -> WorkloadVolume {
    WorkloadVolume {
        namespace: "db".into(),
        pod_name: "pg-0".into(),
        pod_uid: "pod-uid".into(),
        volume: "data".into(),
        claim_name: "data-pg-0".into(),
        restore_name: "pg-restore".into(),
        restore_uid: "restore-uid".into(),
    }
}

fn prepare(name: &str, phase: Phase) -> PreparePod {
    PreparePod {
        namespace: "db".into(),
        name: name.into(),
        uid: format!("{name}-uid"),
        claim_name: "data-pg-0".into(),
        restore_uid: "restore-uid".into(),
        phase,
        message: None,
        // The mover's permanent exit; [`transient`] is a failure of the moment.
        permanent: phase == Phase::Failed,
    }
}

fn transient(name: &str) -> PreparePod {
    PreparePod {
        permanent: false,
        message: Some("exit code 137".into()),
        ..prepare(name, Phase::Failed)
    }
}

fn key(prepare_name: &str) -> VerificationKey {
    VerificationKey {
        pod_uid: "pod-uid".into(),
        volume: "data".into(),
        prepare_pod_uid: format!("{prepare_name}-uid"),
    }
}

fn verified() -> Verification {
    Verification::Done(Outcome::Verified {
        at_unix_nanos: 42,
        summary: "3 files".into(),
    })
}

fn failed() -> Verification {
    Verification::Done(Outcome::Failed {
        reason: VolumeFailure::ContentMismatch,
        message: "a: size 1, expected 2".into(),
    })
}

#[test]
fn states_follow_the_prepare_pods_and_verifications() {
    let none = BTreeMap::new();
    let verified_a = BTreeMap::from([(key("a"), verified())]);
    let failed_a = BTreeMap::from([(key("a"), failed())]);
    let running_a = BTreeMap::from([(key("a"), Verification::Running { note: None })]);
    let verified_b = BTreeMap::from([(key("b"), verified())]);
    let failed = State::Failed {
        reason: VolumeFailure::ContentMismatch,
        message: "a: size 1, expected 2".into(),
    };
    let prepare_failed = |state: &State| matches!(state, State::Failed { reason, .. } if *reason == VolumeFailure::PrepareDataFailed);

    struct Row<'a> {
        name: &'a str,
        prepare: Vec<PreparePod>,
        verifications: &'a BTreeMap<VerificationKey, Verification>,
        state: &'a dyn Fn(&State) -> bool,
        start: Option<VerificationKey>,
    }
    let rows = [
        Row {
            name: "no prepareData pod yet",
            prepare: vec![],
            verifications: &none,
            state: &|state| *state == State::Pending,
            start: None,
        },
        Row {
            name: "prepareData pod running",
            prepare: vec![prepare("a", Phase::Active)],
            verifications: &none,
            state: &|state| *state == State::Restoring,
            start: None,
        },
        Row {
            name: "prepareData succeeded: verification starts",
            prepare: vec![prepare("a", Phase::Succeeded)],
            verifications: &none,
            state: &|state| *state == State::Verifying,
            start: Some(key("a")),
        },
        Row {
            name: "verification running: not started twice",
            prepare: vec![prepare("a", Phase::Succeeded)],
            verifications: &running_a,
            state: &|state| *state == State::Verifying,
            start: None,
        },
        Row {
            name: "verified",
            prepare: vec![prepare("a", Phase::Succeeded)],
            verifications: &verified_a,
            state: &|state| *state == State::Verified { at_unix_nanos: 42 },
            start: None,
        },
        Row {
            name: "verification failed",
            prepare: vec![prepare("a", Phase::Succeeded)],
            verifications: &failed_a,
            state: &|state| *state == failed,
            start: None,
        },
        Row {
            name: "prepareData failed",
            prepare: vec![prepare("a", Phase::Failed)],
            verifications: &none,
            state: &prepare_failed,
            start: None,
        },
        Row {
            name: "a pod failed for a reason of the moment: its Job tries again, still held",
            prepare: vec![transient("a")],
            verifications: &none,
            state: &|state| *state == State::Restoring,
            start: None,
        },
        Row {
            name: "a permanent failure beside a failure of the moment: failed",
            prepare: vec![transient("a"), prepare("b", Phase::Failed)],
            verifications: &none,
            state: &prepare_failed,
            start: None,
        },
        Row {
            name: "the retried pod succeeded after a failure of the moment: verified afresh",
            prepare: vec![transient("a"), prepare("b", Phase::Succeeded)],
            verifications: &none,
            state: &|state| *state == State::Verifying,
            start: Some(key("b")),
        },
        Row {
            name: "a retry after a failed pod is restoring again",
            prepare: vec![prepare("a", Phase::Failed), prepare("b", Phase::Active)],
            verifications: &none,
            state: &|state| *state == State::Restoring,
            start: None,
        },
        Row {
            name: "a new successful attempt is verified afresh",
            prepare: vec![prepare("a", Phase::Failed), prepare("b", Phase::Succeeded)],
            verifications: &failed_a,
            state: &|state| *state == State::Verifying,
            start: Some(key("b")),
        },
        Row {
            name: "a verified result is kept over another succeeded pod",
            prepare: vec![
                prepare("a", Phase::Succeeded),
                prepare("b", Phase::Succeeded),
            ],
            verifications: &verified_b,
            state: &|state| *state == State::Verified { at_unix_nanos: 42 },
            start: None,
        },
        Row {
            name: "a verification of the workload's other volume does not count",
            prepare: vec![prepare("a", Phase::Succeeded)],
            verifications: &BTreeMap::from([(
                VerificationKey {
                    volume: "wal".into(),
                    ..key("a")
                },
                verified(),
            )]),
            state: &|state| *state == State::Verifying,
            start: Some(key("a")),
        },
        Row {
            name: "a prepareData pod of another Restore does not count",
            prepare: vec![PreparePod {
                restore_uid: "other-restore".into(),
                ..prepare("a", Phase::Succeeded)
            }],
            verifications: &verified_a,
            state: &|state| *state == State::Pending,
            start: None,
        },
        Row {
            name: "a prepareData pod of another claim does not count",
            prepare: vec![PreparePod {
                claim_name: "wal-pg-0".into(),
                ..prepare("a", Phase::Succeeded)
            }],
            verifications: &none,
            state: &|state| *state == State::Pending,
            start: None,
        },
        Row {
            name: "a prepareData pod in another namespace does not count",
            prepare: vec![PreparePod {
                namespace: "other".into(),
                ..prepare("a", Phase::Succeeded)
            }],
            verifications: &none,
            state: &|state| *state == State::Pending,
            start: None,
        },
    ];
    for row in rows {
        let decision = decide(
            &volume(),
            &row.prepare,
            row.verifications,
            &watched(Recorded::new()),
        );
        assert!(
            (row.state)(&decision.state),
            "{}: got {:?}",
            row.name,
            decision.state
        );
        assert_eq!(decision.start, row.start, "{}", row.name);
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

#[test]
fn a_verification_the_restore_records_stands_without_reading_the_volume() {
    let recorded: Recorded = [(
        (
            "db".to_string(),
            "restore-uid".to_string(),
            "data-pg-0".to_string(),
        ),
        RecordedVolume::Verified,
    )]
    .into();
    // Whatever else is known, even a failed verification of the since-changed volume.
    let failed: BTreeMap<VerificationKey, Verification> = [(
        key("a"),
        Verification::Done(Outcome::Failed {
            reason: VolumeFailure::ContentMismatch,
            message: "changed since".into(),
        }),
    )]
    .into();
    for (name, prepare, verifications) in [
        ("the prepareData pod is gone", vec![], &BTreeMap::new()),
        (
            "the prepareData pod succeeded, nothing verified yet",
            vec![prepare("a", Phase::Succeeded)],
            &BTreeMap::new(),
        ),
        (
            "a verification of the changed volume failed",
            vec![prepare("a", Phase::Succeeded)],
            &failed,
        ),
    ] {
        let decision = decide(
            &volume(),
            &prepare,
            verifications,
            &watched(recorded.clone()),
        );
        assert!(
            matches!(decision.state, State::Verified { .. }),
            "{name}: {decision:?}"
        );
        assert_eq!(decision.start, None, "{name}");
    }
    // Another Restore's record, another claim's or another namespace's: not this volume's.
    for other in [
        ("db", "other-restore", "data-pg-0"),
        ("db", "restore-uid", "wal-pg-0"),
        ("other", "restore-uid", "data-pg-0"),
    ] {
        let recorded: Recorded = [(
            (
                other.0.to_string(),
                other.1.to_string(),
                other.2.to_string(),
            ),
            RecordedVolume::Verified,
        )]
        .into();
        let decision = decide(&volume(), &[], &BTreeMap::new(), &watched(recorded.clone()));
        assert_eq!(decision.state, State::Pending, "{other:?}");
    }
}

#[test]
fn a_failure_the_restore_records_ends_a_volume_this_agent_had_not_finished() {
    let recorded: Recorded = [(
        (
            "db".to_string(),
            "restore-uid".to_string(),
            "data-pg-0".to_string(),
        ),
        RecordedVolume::Failed {
            reason: "RestoreJobFailed".into(),
            message: "Job data-pg-0-restore-1 gave up: BackoffLimitExceeded".into(),
        },
    )]
    .into();
    let running: BTreeMap<VerificationKey, Verification> =
        [(key("a"), Verification::Running { note: None })].into();
    let verified_a: BTreeMap<VerificationKey, Verification> = [(key("a"), verified())].into();
    let mismatch: BTreeMap<VerificationKey, Verification> = [(
        key("a"),
        Verification::Done(Outcome::Failed {
            reason: VolumeFailure::ContentMismatch,
            message: "1 difference".into(),
        }),
    )]
    .into();
    let none = BTreeMap::new();
    // Without the record each of these would stay pending, restoring or verifying.
    for (name, prepare, verifications) in [
        ("no prepareData pod", vec![], &none),
        ("its pod failed for the moment", vec![transient("a")], &none),
        (
            "a pod still writing",
            vec![prepare("a", Phase::Active)],
            &none,
        ),
        (
            "succeeded, verification not started",
            vec![prepare("a", Phase::Succeeded)],
            &none,
        ),
        (
            "succeeded, verification running",
            vec![prepare("a", Phase::Succeeded)],
            &running,
        ),
    ] {
        let decision = decide(
            &volume(),
            &prepare,
            verifications,
            &watched(recorded.clone()),
        );
        let State::Failed { reason, message } = &decision.state else {
            panic!("{name}: {decision:?}");
        };
        assert_eq!(*reason, VolumeFailure::RestoreFailed, "{name}");
        assert_eq!(
            message,
            "Restore pg-restore failed this volume: RestoreJobFailed: Job data-pg-0-restore-1 gave up: BackoffLimitExceeded",
            "{name}"
        );
        assert_eq!(decision.start, None, "{name}");
    }
    // What this agent found itself stands: its own verification, its own failure.
    let own = decide(
        &volume(),
        &[prepare("a", Phase::Succeeded)],
        &verified_a,
        &watched(recorded.clone()),
    );
    assert!(matches!(own.state, State::Verified { .. }), "{own:?}");
    let own = decide(
        &volume(),
        &[prepare("a", Phase::Succeeded)],
        &mismatch,
        &watched(recorded.clone()),
    );
    assert!(
        matches!(
            own.state,
            State::Failed {
                reason: VolumeFailure::ContentMismatch,
                ..
            }
        ),
        "{own:?}"
    );
    // Another Restore's failure is not this volume's.
    let other: Recorded = [(
        (
            "db".to_string(),
            "other-restore".to_string(),
            "data-pg-0".to_string(),
        ),
        RecordedVolume::Failed {
            reason: "RestoreJobFailed".into(),
            message: String::new(),
        },
    )]
    .into();
    let decision = decide(&volume(), &[], &none, &watched(other.clone()));
    assert_eq!(decision.state, State::Pending);
}

fn target(claims: &[&str]) -> RestoreTarget {
    RestoreTarget {
        name: "pg-restore".into(),
        uid: "restore-uid".into(),
        claims: claims.iter().map(|claim| claim.to_string()).collect(),
    }
}

#[test]
fn what_a_pod_waits_for_comes_from_custody_wait_not_from_labels() {
    let env = map(&[
        (names::ENV_RESTORE, "pg-restore"),
        (names::ENV_RESTORE_UID, "restore-uid"),
        (names::ENV_RESTORED_CLAIMS, "data-pg-0, wal-pg-0"),
    ]);
    let labels = map(&[(names::LABEL_RESTORE_UID, "restore-uid")]);
    let annotations = map(&[
        (names::ANNOTATION_RESTORE, "pg-restore"),
        (names::ANNOTATION_RESTORED_CLAIMS, "data-pg-0, wal-pg-0"),
    ]);
    let wanted = Some(Ok(target(&["data-pg-0", "wal-pg-0"])));
    assert_eq!(restore_target(Some(&env), &labels, &annotations), wanted);
    // Labels and annotations removed by a patch change nothing.
    let none = BTreeMap::new();
    assert_eq!(restore_target(Some(&env), &none, &none), wanted);
    // Nor do labels and annotations that say something else.
    let forged = map(&[
        (names::ANNOTATION_RESTORE, "pg-restore"),
        (names::ANNOTATION_RESTORED_CLAIMS, "scratch-pg-0"),
    ]);
    assert_eq!(restore_target(Some(&env), &none, &forged), wanted);
    // custody-wait without what it waits for holds the pod.
    assert!(matches!(
        restore_target(Some(&none), &none, &none),
        Some(Err(_))
    ));
    let partial = map(&[(names::ENV_RESTORE_UID, "restore-uid")]);
    assert!(matches!(
        restore_target(Some(&partial), &labels, &annotations),
        Some(Err(_))
    ));
    // A pod admitted by an older webhook: its labels and annotations.
    assert_eq!(restore_target(Some(&none), &labels, &annotations), wanted);
    assert_eq!(restore_target(None, &labels, &annotations), wanted);
    // Not under restore.
    assert_eq!(restore_target(None, &labels, &none), None);
}

#[test]
fn workload_volumes_come_from_the_target_and_the_pod_spec() {
    let claims = vec![
        ("data".to_string(), "data-pg-0".to_string()),
        ("wal".to_string(), "wal-pg-0".to_string()),
        ("scratch".to_string(), "scratch-pg-0".to_string()),
    ];
    let volumes = workload_volumes(
        "db",
        "pg-0",
        "pod-uid",
        &target(&["data-pg-0", "wal-pg-0"]),
        &claims,
    )
    .unwrap();
    assert_eq!(
        volumes
            .iter()
            .map(|v| (v.volume.as_str(), v.claim_name.as_str()))
            .collect::<Vec<_>>(),
        [("data", "data-pg-0"), ("wal", "wal-pg-0")]
    );
    assert_eq!(volumes[0], volume());

    let refused = [
        (
            "no Restore name",
            map(&[(names::ANNOTATION_RESTORED_CLAIMS, "data-pg-0")]),
            map(&[(names::LABEL_RESTORE_UID, "restore-uid")]),
        ),
        (
            "no Restore UID",
            map(&[
                (names::ANNOTATION_RESTORE, "pg-restore"),
                (names::ANNOTATION_RESTORED_CLAIMS, "data-pg-0"),
            ]),
            BTreeMap::new(),
        ),
        (
            "an empty claim list",
            map(&[
                (names::ANNOTATION_RESTORE, "pg-restore"),
                (names::ANNOTATION_RESTORED_CLAIMS, " , "),
            ]),
            map(&[(names::LABEL_RESTORE_UID, "restore-uid")]),
        ),
    ];
    for (name, annotations, labels) in refused {
        assert!(
            matches!(restore_target(None, &labels, &annotations), Some(Err(_))),
            "{name}"
        );
    }
    assert!(
        workload_volumes(
            "db",
            "pg-0",
            "pod-uid",
            &target(&["data-pg-0", "missing"]),
            &claims
        )
        .is_err(),
        "a claim the pod does not mount"
    );
    let twice = vec![
        ("data".to_string(), "data-pg-0".to_string()),
        ("again".to_string(), "data-pg-0".to_string()),
        ("wal".to_string(), "wal-pg-0".to_string()),
    ];
    assert!(
        workload_volumes(
            "db",
            "pg-0",
            "pod-uid",
            &target(&["data-pg-0", "wal-pg-0"]),
            &twice
        )
        .is_err()
    );
}

/// A gated pod's Restore that the watch does not hold is asked for, once; gone, it decides
/// from the claim's record alone: the pod is released only on a claim carrying that Restore's
/// record, and otherwise fails saying why instead of waiting for a prepareData pod that will
/// never come. A Restore that exists after all (the watch lagged) decides as usual.
#[test]
fn a_restore_that_is_gone_decides_from_the_claims_record() {
    let restore_key = Restores::key(&volume());
    let gone = |replaced_by: Option<&str>, verified: bool| Absence::RestoreGone {
        replaced_by: replaced_by.map(str::to_string),
        verified,
    };
    let succeeded = [prepare("a", Phase::Succeeded)];
    let verified_a: BTreeMap<VerificationKey, Verification> = [(key("a"), verified())].into();
    let none = BTreeMap::new();
    // (name, watched, absence, prepare pods, verifications, state, asks)
    type Row<'a> = (
        &'a str,
        bool,
        Option<Absence>,
        &'a [PreparePod],
        &'a BTreeMap<VerificationKey, Verification>,
        &'a str,
        bool,
    );
    let rows: [Row; 10] = [
        (
            "watched",
            true,
            None,
            &succeeded,
            &verified_a,
            "Verified",
            false,
        ),
        (
            "not watched, not asked",
            false,
            None,
            &succeeded,
            &verified_a,
            "Pending",
            true,
        ),
        (
            "asking",
            false,
            Some(Absence::Asking),
            &succeeded,
            &verified_a,
            "Pending",
            false,
        ),
        (
            "the watch lagged",
            false,
            Some(Absence::RestoreExists),
            &succeeded,
            &verified_a,
            "Verified",
            false,
        ),
        (
            "the watch lagged, nothing verified yet",
            false,
            Some(Absence::RestoreExists),
            &succeeded,
            &none,
            "Verifying",
            false,
        ),
        (
            "not watched, nothing verified yet",
            false,
            None,
            &succeeded,
            &none,
            "Pending",
            true,
        ),
        (
            "gone, recorded on the claim",
            false,
            Some(gone(None, true)),
            &[],
            &none,
            "Verified",
            false,
        ),
        (
            "gone, not recorded",
            false,
            Some(gone(None, false)),
            &[],
            &none,
            "Failed",
            false,
        ),
        // Its prepareData pod's output, verified by this agent, no longer counts: the Restore
        // that vouched for the Backup is gone.
        (
            "gone, a verification of its pod",
            false,
            Some(gone(None, false)),
            &succeeded,
            &verified_a,
            "Failed",
            false,
        ),
        (
            "replaced",
            false,
            Some(gone(Some("new-uid"), false)),
            &[],
            &none,
            "Failed",
            false,
        ),
    ];
    for (name, watched_now, absence, prepare, verifications, state, asks) in rows {
        let mut restores = Restores::default();
        if watched_now {
            restores = watched(Recorded::new());
        }
        if let Some(absence) = absence {
            restores.absences.insert(restore_key.clone(), absence);
        }
        let decision = decide(&volume(), prepare, verifications, &restores);
        assert_eq!(decision.state.name(), state, "{name}: {decision:?}");
        assert_eq!(restores.to_ask(&volume()), asks, "{name}");
        // A verification starts only for a Restore known to exist.
        let starts = name == "the watch lagged, nothing verified yet";
        assert_eq!(
            decision.start,
            starts.then(|| key("a")),
            "{name}: {decision:?}"
        );
        assert!(!decision.message.is_empty(), "{name}");
    }
    // The failure names the Restore, the claim and what to do.
    let mut restores = Restores::default();
    restores
        .absences
        .insert(restore_key.clone(), gone(None, false));
    let decision = decide(&volume(), &[], &none, &restores);
    assert_eq!(
        decision.state,
        State::Failed {
            reason: VolumeFailure::RestoreNotFound,
            message: decision.message.clone()
        }
    );
    for part in [
        "pg-restore",
        "restore-uid",
        "data-pg-0",
        "was deleted",
        "Restore the Cluster again",
    ] {
        assert!(
            decision.message.contains(part),
            "{part}: {}",
            decision.message
        );
    }
    restores
        .absences
        .insert(restore_key.clone(), gone(Some("new-uid"), false));
    let decision = decide(&volume(), &[], &none, &restores);
    assert!(
        matches!(
            decision.state,
            State::Failed {
                reason: VolumeFailure::RestoreReplaced,
                ..
            }
        ),
        "{decision:?}"
    );
    // What the Restore's status records while the watch held it still counts.
    let mut restores = Restores::default();
    restores
        .recorded
        .insert(restore_key.clone(), RecordedVolume::Verified);
    assert!(!restores.to_ask(&volume()));
    assert_eq!(
        decide(&volume(), &[], &none, &restores).state.name(),
        "Verified"
    );
}

/// What the API server's answers mean: the Restore of the pod's UID exists; or it is gone (or
/// another has its name) and the claim says whether that Restore verified it.
#[test]
fn the_answers_about_a_restore_say_whether_it_is_gone_and_verified() {
    let own = names::verified_by_restore("restore-uid");
    let annotations = |keys: &[&str]| -> BTreeMap<String, String> {
        keys.iter()
            .map(|key| (key.to_string(), "pg-restore".to_string()))
            .collect()
    };
    let with_own = annotations(&[own.as_str(), names::ANNOTATION_KNOWN_DATA]);
    let known_only = annotations(&[names::ANNOTATION_KNOWN_DATA]);
    let other = annotations(&["verified.custody.io/other-uid"]);
    let rows = [
        (Some("restore-uid"), None, Absence::RestoreExists),
        (Some("restore-uid"), Some(&with_own), Absence::RestoreExists),
        (
            None,
            Some(&with_own),
            Absence::RestoreGone {
                replaced_by: None,
                verified: true,
            },
        ),
        (
            None,
            Some(&known_only),
            Absence::RestoreGone {
                replaced_by: None,
                verified: false,
            },
        ),
        (
            None,
            Some(&other),
            Absence::RestoreGone {
                replaced_by: None,
                verified: false,
            },
        ),
        (
            None,
            None,
            Absence::RestoreGone {
                replaced_by: None,
                verified: false,
            },
        ),
        (
            Some("new-uid"),
            Some(&with_own),
            Absence::RestoreGone {
                replaced_by: Some("new-uid".into()),
                verified: true,
            },
        ),
        (
            Some("new-uid"),
            None,
            Absence::RestoreGone {
                replaced_by: Some("new-uid".into()),
                verified: false,
            },
        ),
    ];
    for (restore_uid, claim, expected) in rows {
        assert_eq!(
            absence(&volume(), restore_uid, claim),
            expected,
            "{restore_uid:?} {claim:?}"
        );
    }
}
