//! Issue 25 item 1: the alert rules of deploy/monitoring/ pass their `promtool test rules`
//! cases, and every metric the rules and the Grafana dashboard read is one custody exports
//! under that name (a renamed metric or a typo in a query turns this red).

use std::collections::BTreeSet;
use std::process::Command;

use custody_controller::health::{Agent, Drilled, Health, Key, Last, Waiting};
use custody_tests::repo_root;

/// Builds (once, cached) and returns promtool.
fn promtool() -> std::path::PathBuf {
    let output = Command::new(repo_root().join("hack/build-prometheus.sh"))
        .output()
        .expect("running hack/build-prometheus.sh");
    assert!(
        output.status.success(),
        "hack/build-prometheus.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("paths");
    stdout
        .lines()
        .last()
        .expect("promtool's path on the last line")
        .into()
}

/// The rule file inside deploy/monitoring/rules.yaml (a PrometheusRule's spec).
fn rule_file() -> String {
    let text = std::fs::read_to_string(repo_root().join("deploy/monitoring/rules.yaml"))
        .expect("deploy/monitoring/rules.yaml");
    let rule: serde_yaml::Value = serde_yaml::from_str(&text).expect("rules.yaml parses");
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    serde_yaml::to_string(&rule["spec"]).expect("spec")
}

#[test]
fn the_alert_rules_pass_their_promtool_cases() {
    let promtool = promtool();
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    std::fs::write(dir.join("custody-rules.yaml"), rule_file()).unwrap();
    std::fs::copy(
        repo_root().join("deploy/monitoring/rules.test.yaml"),
        dir.join("rules.test.yaml"),
    )
    .unwrap();
    for args in [
        vec!["check", "rules", "custody-rules.yaml"],
        vec!["test", "rules", "rules.test.yaml"],
    ] {
        let output = Command::new(&promtool)
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("running promtool");
        assert!(
            output.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // Every alert has cases: an alert added without them turns this red.
    let rules: serde_yaml::Value = serde_yaml::from_str(&rule_file()).unwrap();
    let tested = std::fs::read_to_string(dir.join("rules.test.yaml")).unwrap();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().expect("every rule is an alert");
            assert!(
                tested.contains(&format!("alertname: {alert}\n")),
                "{alert} has no case in rules.test.yaml"
            );
        }
    }
}

/// Every sample name custody's controller and agent export, with one of each series present.
fn exported() -> BTreeSet<String> {
    use custody_agent::metrics as agent;
    use custody_controller::metrics as controller;
    use custody_kube::http::Exposition;

    let controller = controller::Metrics::default();
    let key = |name: &str| Key {
        namespace: "shop".to_string(),
        name: name.to_string(),
    };
    controller.health.set(Some(Health {
        clusters: [(
            key("orders"),
            Last {
                success: Some(1.0),
                failure: Some(2.0),
            },
        )]
        .into(),
        plans: [(
            key("nightly"),
            Last {
                success: Some(1.0),
                failure: Some(2.0),
            },
        )]
        .into(),
        plans_created: [(key("nightly"), 0.0)].into(),
        restores_waiting: [(
            key("held"),
            Waiting {
                reason: "Verifying".to_string(),
                since: 0.0,
            },
        )]
        .into(),
        agents: [(
            "node-1".to_string(),
            Agent {
                last_heartbeat: Some(1.0),
                reporting: true,
            },
        )]
        .into(),
        deletions_retrying: [("shop".to_string(), 1)].into(),
        drills: [(
            key("nightly"),
            Drilled {
                last: 2.0,
                passed: false,
                last_success: Some(1.0),
            },
        )]
        .into(),
    }));
    controller.drill_finished("Failed", "CheckFailed");
    for kind in [
        custody_controller::health::FinishedKind::Backup,
        custody_controller::health::FinishedKind::Restore,
    ] {
        controller.finished(&custody_controller::health::Finished {
            kind,
            completed: true,
            reason: "Completed".to_string(),
            duration: Some(1.0),
            bytes: Some(1),
            frozen: Some(0.1),
        });
    }
    controller.artifact_deletion("Deleted");
    controller
        .reconcile_failures
        .get_or_create(&controller::ErrorLabels {
            kind: "Backup",
            error: "X",
        })
        .inc();

    let agent = agent::Metrics::default();
    agent::count(&agent.verifications, "Verified");
    agent.frozen_duration.observe(0.1);

    let mut names = BTreeSet::new();
    for text in [controller.encode(), agent.encode()] {
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let name = line
                .split(['{', ' '])
                .next()
                .expect("a sample line starts with its name");
            names.insert(name.to_string());
        }
    }
    names
}

/// The `custody_*` names a text reads (PromQL in rules or dashboard queries).
fn read_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("custody_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_metric_the_rules_and_the_dashboard_read_is_one_custody_exports() {
    let exported = exported();
    let rules = rule_file();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/monitoring/dashboard.json"))
            .expect("deploy/monitoring/dashboard.json"),
    )
    .expect("the dashboard is JSON");
    let mut queries = String::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for panel in panels {
        let targets = panel["targets"]
            .as_array()
            .expect("every panel has targets");
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        for target in targets {
            queries.push_str(target["expr"].as_str().expect("every target has an expr"));
            queries.push('\n');
        }
    }
    for (what, text) in [("rules.yaml", rules.as_str()), ("dashboard.json", &queries)] {
        let read = read_in(text);
        assert!(!read.is_empty(), "{what} reads no custody metric");
        let unknown: Vec<&String> = read.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{what} reads {unknown:?}, which custody does not export; it exports {exported:?}"
        );
    }
    // The backup-health gauges are all read somewhere (a gauge nobody alerts on or plots is
    // one to drop or to use).
    let everything = format!("{rules}\n{queries}");
    for name in &exported {
        if name.starts_with("custody_")
            && !name.starts_with("custody_controller_")
            && !name.starts_with("custody_agent_")
            && !name.ends_with("_sum")
            && !name.ends_with("_count")
            && !name.ends_with("_bucket")
        {
            assert!(
                everything.contains(name.as_str()),
                "{name} is read by no rule and no panel"
            );
        }
    }
}
