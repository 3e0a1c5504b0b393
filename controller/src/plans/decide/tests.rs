use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

#[test]
fn the_latest_slot_since_the_last_run_is_due_within_its_deadline() {
    let hourly = parse("0 * * * *").unwrap();
    let rows = [
        // (since, now, deadline, expected)
        (
            "2026-11-30T09:00:00Z",
            "2026-11-30T09:30:00Z",
            None,
            Due::Wait {
                next: at("2026-11-30T10:00:00Z"),
            },
        ),
        (
            "2026-11-30T09:00:00Z",
            "2026-11-30T10:00:00Z",
            None,
            Due::Run {
                slot: at("2026-11-30T10:00:00Z"),
                next: at("2026-11-30T11:00:00Z"),
            },
        ),
        (
            "2026-11-30T09:00:00Z",
            "2026-11-30T10:00:30Z",
            Some(60),
            Due::Run {
                slot: at("2026-11-30T10:00:00Z"),
                next: at("2026-11-30T11:00:00Z"),
            },
        ),
        (
            "2026-11-30T09:00:00Z",
            "2026-11-30T10:05:00Z",
            Some(60),
            Due::Missed {
                slot: at("2026-11-30T10:00:00Z"),
                next: at("2026-11-30T11:00:00Z"),
            },
        ),
        // Several slots missed (controller down): only the latest runs, once.
        (
            "2026-11-30T01:00:00Z",
            "2026-11-30T10:10:00Z",
            None,
            Due::Run {
                slot: at("2026-11-30T10:00:00Z"),
                next: at("2026-11-30T11:00:00Z"),
            },
        ),
        // The slot was already run.
        (
            "2026-11-30T10:00:00Z",
            "2026-11-30T10:10:00Z",
            None,
            Due::Wait {
                next: at("2026-11-30T11:00:00Z"),
            },
        ),
    ];
    for (since, now, deadline, expected) in rows {
        let found = due(
            &hourly,
            at(since),
            at(now),
            deadline.map(Duration::from_secs),
        )
        .unwrap();
        assert_eq!(found, expected, "since {since}, now {now}");
    }
}

#[test]
fn run_names_are_deterministic_per_slot() {
    let minutes = parse("*/5 * * * *").unwrap();
    let seconds = parse("*/3 * * * * *").unwrap();
    let slot = at("2026-11-30T10:00:00Z");
    assert_eq!(
        run_name("nightly", slot, &minutes),
        format!("nightly-{}", slot.as_second() / 60)
    );
    assert_eq!(
        run_name("nightly", slot, &minutes),
        run_name("nightly", slot, &minutes)
    );
    assert_eq!(
        run_name("fast", slot, &seconds),
        format!("fast-{}", slot.as_second())
    );
    assert!(run_name(&"p".repeat(300), slot, &minutes).len() <= 253);
    assert!(parse("not a schedule").is_err());
    assert!(parse("61 * * * *").is_err());
}

#[test]
fn ages_parse_in_units() {
    assert_eq!(parse_age("30s").unwrap(), Duration::from_secs(30));
    assert_eq!(parse_age("1d12h").unwrap(), Duration::from_secs(36 * 3600));
    assert_eq!(parse_age("90m").unwrap(), Duration::from_secs(5400));
    for bad in ["", "12", "d", "3w", "1h30"] {
        assert!(parse_age(bad).is_err(), "{bad:?}");
    }
}

fn run(name: &str, minute: u32, finished: bool, completed: bool) -> Run {
    Run {
        name: name.into(),
        uid: format!("{name}-uid"),
        created: at(&format!("2026-11-30T10:{minute:02}:00Z")),
        finished,
        completed,
    }
}

fn names(runs: Vec<Run>) -> Vec<String> {
    runs.into_iter().map(|run| run.name).collect()
}

#[test]
fn retention_prunes_the_oldest_finished_runs_and_never_the_last_good_one() {
    let now = at("2026-11-30T11:00:00Z");
    let runs = vec![
        run("a", 1, true, true),
        run("b", 2, true, false),
        run("c", 3, true, true),
        run("d", 4, false, false),
        run("e", 5, true, true),
    ];
    assert_eq!(names(prune(&runs, Some(2), None, now)), ["b", "a"]);
    assert_eq!(
        names(prune(&runs, Some(10), None, now)),
        Vec::<String>::new()
    );
    // Everything is older than 10 minutes: all finished runs go except the newest completed.
    assert_eq!(
        names(prune(&runs, None, Some(Duration::from_secs(600)), now)),
        ["c", "b", "a"]
    );
    // The running one is never pruned, even with keep_last 1.
    assert_eq!(names(prune(&runs, Some(1), None, now)), ["c", "b", "a"]);
    // Only failures: the newest failure is not protected, the count still applies.
    let failures = vec![run("x", 1, true, false), run("y", 2, true, false)];
    assert_eq!(names(prune(&failures, Some(1), None, now)), ["x"]);
}

#[test]
fn only_a_plan_with_no_method_anywhere_and_no_command_needs_a_person() {
    let spec = |extra: serde_json::Value| -> custody_kube::api::BackupPlanSpec {
        let mut spec =
            serde_json::json!({"clusterRef": {"name": "orders"}, "schedule": "0 * * * *"});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        serde_json::from_value(spec).unwrap()
    };
    let cluster = |consistency: bool| -> custody_kube::api::Cluster {
        let mut spec =
            serde_json::json!({"statefulSetRef": {"name": "db"}, "volumeClaimTemplates": ["data"]});
        if consistency {
            spec["consistency"] = serde_json::json!({"method": "Freeze"});
        }
        serde_json::from_value(serde_json::json!({"apiVersion": "custody.io/v1alpha1",
            "kind": "Cluster", "metadata": {"name": "orders"}, "spec": spec}))
        .unwrap()
    };
    let bare = spec(serde_json::json!({}));
    let method = spec(
        serde_json::json!({"consistency": {"method": "Tool", "tool": {"image": "t", "command": ["x"]}}}),
    );
    let command =
        spec(serde_json::json!({"command": {"image": "pg", "command": ["dump"], "prefix": "d"}}));
    // (plan, Cluster, needs a person)
    let rows = [
        (&bare, Some(cluster(false)), true),
        (&bare, Some(cluster(true)), false),
        (&bare, None, false),
        (&method, Some(cluster(false)), false),
        (&command, Some(cluster(false)), false),
    ];
    for (plan, cluster, needs) in rows {
        assert_eq!(
            needs_a_person(plan, cluster.as_ref()).is_some(),
            needs,
            "{plan:?} {cluster:?}"
        );
    }
}
