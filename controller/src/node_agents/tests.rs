use super::*;
use custody_proto::report::{ClockSample, VolumeReport};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

#[test]
fn offsets_read_like_people_write_them() {
    for (nanos, text) in [
        (0, "+0.0µs"),
        (850_000, "+850.0µs"),
        (-12_345_678, "-12.3ms"),
        (1_250_000_000, "+1.250s"),
        (-30_000_400_000, "-30.000s"),
        (i64::MIN, "-9223372036.855s"),
    ] {
        assert_eq!(format_offset(nanos), text, "{nanos}");
    }
}

#[test]
fn a_node_is_ready_while_its_agent_reports_within_the_timeout() {
    let timeout = Duration::from_secs(30);
    let rows = [
        (None, Status::Unknown, reasons::NO_HEARTBEAT),
        (Some(at(1000)), Status::True, reasons::HEARTBEAT_RECEIVED),
        (Some(at(971)), Status::True, reasons::HEARTBEAT_RECEIVED),
        (Some(at(970)), Status::True, reasons::HEARTBEAT_RECEIVED),
        (Some(at(969)), Status::False, reasons::HEARTBEAT_MISSED),
        (Some(at(0)), Status::False, reasons::HEARTBEAT_MISSED),
        // A heartbeat stamped after now (clock steps) is not a missed one.
        (Some(at(1005)), Status::True, reasons::HEARTBEAT_RECEIVED),
    ];
    for (last, status, reason) in rows {
        let desired = readiness(last, at(1000), timeout);
        assert_eq!(
            (desired.status, desired.reason),
            (status, reason),
            "{last:?}"
        );
    }
}

fn report() -> NodeReport {
    let volume = |state: VolumeState| VolumeReport {
        state: state as i32,
        ..VolumeReport::default()
    };
    NodeReport {
        node_name: "node-1".into(),
        agent_version: "0.1.0".into(),
        clock: Some(ClockSample {
            offset_nanos: 30_000_000_000,
            round_trip_nanos: 400_000,
            measured_at_unix_nanos: 1,
        }),
        volumes: vec![
            volume(VolumeState::Pending),
            volume(VolumeState::Verified),
            volume(VolumeState::Verified),
            volume(VolumeState::Failed),
            volume(VolumeState::Verifying),
            volume(VolumeState::Restoring),
        ],
        thaws: vec![],
        movers: vec![custody_proto::report::MoverProgress {
            namespace: "shop".into(),
            pod_name: "backup-pod".into(),
            pod_uid: "pod-uid".into(),
            job_name: "backup-job".into(),
            owner_uid: "backup-uid".into(),
            operation: "backup".into(),
            volume: "data".into(),
            bytes_done: 5,
            files_done: 1,
            bytes_total: Some(10),
            files_total: None,
            bytes_sent: 0,
        }],
    }
}

#[test]
fn a_heartbeat_writes_clock_volumes_and_ready() {
    let status = status_from_report(&report(), None, at(1000));
    assert_eq!(status.agent_version.as_deref(), Some("0.1.0"));
    assert_eq!(status.clock_offset.as_deref(), Some("+30.000s"));
    assert_eq!(status.clock_offset_nanoseconds, Some(30_000_000_000));
    assert_eq!(status.round_trip_nanoseconds, Some(400_000));
    assert_eq!(
        status.volumes,
        Some(VolumeCounts {
            pending: 1,
            restoring: 1,
            verifying: 1,
            verified: 2,
            failed: 1,
        })
    );
    assert_eq!(status.last_heartbeat_time, Some(Time(at(1000))));
    // The movers' progress, for the backup and restore reconcilers.
    assert_eq!(
        status.movers,
        [custody_kube::api::ReportedMover {
            namespace: "shop".into(),
            pod_name: "backup-pod".into(),
            pod_uid: "pod-uid".into(),
            job_name: "backup-job".into(),
            owner_uid: "backup-uid".into(),
            operation: "backup".into(),
            volume: "data".into(),
            bytes_done: 5,
            files_done: 1,
            bytes_total: Some(10),
            files_total: None,
            bytes_sent: 0,
        }]
    );
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "HeartbeatReceived")
    );
    assert_eq!(ready.last_transition_time, Time(at(1000)));

    // The next heartbeat keeps the transition time; a report without a clock sample says so.
    let next = status_from_report(
        &NodeReport {
            clock: None,
            ..report()
        },
        Some(&status),
        at(1010),
    );
    assert_eq!(next.conditions[0].last_transition_time, Time(at(1000)));
    assert_eq!(next.clock_offset, None);
}

#[test]
fn silence_turns_the_node_not_ready_once() {
    let timeout = Duration::from_secs(30);
    let status = status_from_report(&report(), None, at(1000));
    assert_eq!(status_after_silence(&status, at(1020), timeout), None);
    let silent = status_after_silence(&status, at(1031), timeout).expect("flips");
    let ready = &silent.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "HeartbeatMissed")
    );
    assert_eq!(ready.last_transition_time, Time(at(1031)));
    assert!(
        ready.message.contains("1970-01-01T00:16:40Z"),
        "{}",
        ready.message
    );
    // Everything else the report wrote is kept.
    assert_eq!(silent.clock_offset, status.clock_offset);
    assert_eq!(silent.volumes, status.volumes);
    assert_eq!(silent.movers, status.movers);
    // Written once: later checks change nothing.
    let later = status_after_silence(&silent, at(5000), timeout);
    assert_eq!(later, None);
}

#[test]
fn a_node_with_many_volumes_lists_a_bounded_number_and_counts_the_rest() {
    let volume = |index: usize, state: VolumeState| VolumeReport {
        namespace: "ns".into(),
        pod_name: format!("db-{index:04}"),
        claim_name: format!("data-db-{index:04}"),
        state: state as i32,
        message: "é".repeat(2_000),
        ..VolumeReport::default()
    };
    let mut report = report();
    report.volumes = (0..500)
        .map(|index| volume(index, VolumeState::Verified))
        .chain((500..600).map(|index| volume(index, VolumeState::Pending)))
        .collect();
    let status = status_from_report(&report, None, at(0));
    assert_eq!(status.restored_volumes.len(), MAX_LISTED_VOLUMES);
    assert_eq!(
        status.omitted_volumes,
        Some(600 - MAX_LISTED_VOLUMES as u32)
    );
    let counts = status.volumes.clone().unwrap();
    assert_eq!((counts.pending, counts.verified), (100, 500));
    // Every volume still in progress is listed; only Verified ones were left out.
    let pending = status
        .restored_volumes
        .iter()
        .filter(|volume| volume.state == custody_kube::api::VolumeState::Pending)
        .count();
    assert_eq!(pending, 100);
    for listed in &status.restored_volumes {
        let message = listed.message.as_deref().unwrap();
        assert!(message.len() <= MAX_VOLUME_MESSAGE && message.ends_with('…'));
    }
    // A whole status stays far below etcd's object limit.
    let bytes = serde_json::to_vec(&status).unwrap().len();
    assert!(bytes < 512 << 10, "{bytes} bytes");
    // Few volumes: none left out.
    let status = status_from_report(&self::report(), None, at(0));
    assert_eq!(status.omitted_volumes, None);
}
