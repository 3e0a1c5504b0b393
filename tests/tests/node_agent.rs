//! Agent reports end to end: the real agent reports to the real controller over TLS gRPC,
//! authenticated by a pod-bound token the real API server reviews; the controller writes
//! NodeAgents, turns a silent node not Ready, and measures clocks (with a real skew injected
//! by faketime).

use std::time::Duration;

use custody_controller::conditions::{reasons, types};
use custody_kube::api::{HasConditions, NodeAgent};
use custody_proto::names;
use custody_proto::report::NodeReport;
use custody_tests::agent::{
    AgentArgs, AgentProcess, CONTROLLER_NAME, ControllerProcess, report_client, report_flags,
    report_request, report_token, restore_objects,
};
use custody_tests::kubelet::{FakeKubelet, PodSpec, create_pod, pod_token};
use custody_tests::pki::Pki;
use custody_tests::{TestNamespace, await_condition, kubectl};
use kube::api::{Api, DeleteParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

fn ready(agent: &NodeAgent) -> Option<(String, String)> {
    agent
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::READY)
        .map(|condition| (condition.status.clone(), condition.reason.clone()))
}

#[tokio::test]
async fn node_agents_show_each_nodes_restore_health_and_go_not_ready_when_silent() {
    let namespace = TestNamespace::create("nodeagent").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let node_a = FakeKubelet::new(&client, &format!("{ns}-a")).await;
    let node_b = FakeKubelet::new(&client, &format!("{ns}-b")).await;
    let gate_pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let report_pki = Pki::new(&[CONTROLLER_NAME]);
    let controller = ControllerProcess::start(
        ns,
        &report_pki,
        &[
            format!("--agent-service-account={ns}:custody-agent"),
            "--agent-timeout-seconds=3".to_string(),
        ],
    );

    // One gated pod on each node; the agent runs on node a only.
    let objects = restore_objects(&client, ns, "pg").await;
    for (pod, node, claim) in [
        ("pg-0", &node_a.node, "data-pg-0"),
        ("pg-1", &node_b.node, "data-pg-1"),
    ] {
        let claims = [("data", claim)];
        create_pod(
            &client,
            ns,
            PodSpec {
                name: pod,
                node,
                service_account: "db",
                labels: json!({ names::LABEL_RESTORE_UID: objects.restore_uid() }),
                annotations: json!({
                    names::ANNOTATION_RESTORE: objects.restore_name(),
                    names::ANNOTATION_RESTORED_CLAIMS: claim,
                }),
                claims: &claims,
            },
        )
        .await;
    }
    let token = report_token(&client, ns, &node_a.node).await;
    let mut agent = AgentProcess::start(
        &node_a,
        &gate_pki,
        AgentArgs {
            flags: report_flags(&controller, &report_pki, token.path()),
            ..AgentArgs::default()
        },
    );

    let agents: Api<NodeAgent> = Api::all(client.clone());
    let reported = await_condition(&agents, &node_a.node, "a report", TIMEOUT, |agent| {
        let status = agent.status.as_ref();
        ready(agent) == Some(("True".into(), reasons::HEARTBEAT_RECEIVED.into()))
            && status
                .and_then(|status| status.clock_offset.as_ref())
                .is_some()
            && status
                .and_then(|status| status.volumes.as_ref())
                .is_some_and(|volumes| volumes.pending == 1)
    })
    .await;
    let status = reported.status.expect("status");
    assert_eq!(reported.spec.node_name, node_a.node);
    assert_eq!(
        status.agent_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    // Only node a's pod: the agent does not see node b.
    let volumes = status.volumes.expect("volumes");
    assert_eq!(
        (volumes.pending, volumes.verified, volumes.failed),
        (1, 0, 0)
    );
    // Same machine, same clock: the offset is within the round trip of zero.
    let offset = status.clock_offset_nanoseconds.expect("offset");
    let round_trip = status.round_trip_nanoseconds.expect("round trip");
    assert!(
        offset.abs() <= round_trip.max(1_000_000),
        "offset {offset}, round trip {round_trip}"
    );
    assert!(
        agents.get_opt(&node_b.node).await.unwrap().is_none(),
        "node b has no agent"
    );

    // kubectl shows the per-node view.
    let output = kubectl(&["get", "nodeagents", &node_a.node, "-o", "wide"]);
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NODE",
        "READY",
        "CLOCK OFFSET",
        "PENDING",
        "VERIFIED",
        "FAILED",
        "VERSION",
    ] {
        assert!(header.contains(column), "{column} missing: {table}");
    }
    assert!(
        table.lines().nth(1).is_some_and(|row| row.contains("True")),
        "{table}"
    );

    // Reports that do not come from node a's agent are refused.
    let mut reports = report_client(&controller, &report_pki.ca()).await;
    let send = |token: String, node: String| {
        report_request(
            &token,
            NodeReport {
                node_name: node,
                agent_version: "forged".into(),
                ..NodeReport::default()
            },
        )
    };
    let agent_token = std::fs::read_to_string(token.path()).unwrap();
    let refused = reports
        .report(send(agent_token, node_b.node.clone()))
        .await
        .expect_err("node a's agent reporting about node b");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let workload_pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .get("pg-0")
        .await
        .unwrap();
    let workload_token = pod_token(&client, &workload_pod, names::REPORT_AUDIENCE).await;
    let refused = reports
        .report(send(workload_token, node_a.node.clone()))
        .await
        .expect_err("a workload reporting");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("may not report"), "{refused:?}");
    let metrics = controller.metrics();
    assert!(
        metrics.contains("custody_controller_agent_report_refusals_total{reason=\"OtherNode\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("custody_controller_agent_report_refusals_total{reason=\"NotTheAgent\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "custody_controller_node_clock_offset_seconds{{node=\"{}\"}}",
            node_a.node
        )),
        "{metrics}"
    );

    // The agent stops: the node turns not Ready.
    assert!(
        agent
            .child
            .terminate(Duration::from_secs(10))
            .is_some_and(|status| status.success())
    );
    let silent = await_condition(&agents, &node_a.node, "Ready=False", TIMEOUT, |agent| {
        ready(agent) == Some(("False".into(), reasons::HEARTBEAT_MISSED.into()))
    })
    .await;
    // What the agent last said stays readable.
    assert_eq!(
        silent
            .status
            .and_then(|status| status.volumes)
            .map(|v| v.pending),
        Some(1)
    );

    let _ = agents.delete(&node_a.node, &DeleteParams::default()).await;
    node_a.delete().await;
    node_b.delete().await;
    namespace.delete().await;
}

#[tokio::test]
async fn the_clock_offset_of_a_skewed_node_is_measured_within_the_round_trip() {
    const SKEW_SECONDS: i64 = 30;
    let namespace = TestNamespace::create("clock").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let node = FakeKubelet::new(&client, &format!("{ns}-skewed")).await;
    let gate_pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let report_pki = Pki::new(&[CONTROLLER_NAME]);
    let controller = ControllerProcess::start(
        ns,
        &report_pki,
        &[format!("--agent-service-account={ns}:custody-agent")],
    );
    let token = report_token(&client, ns, &node.node).await;
    let skew = format!("+{SKEW_SECONDS}s");
    let _agent = AgentProcess::start(
        &node,
        &gate_pki,
        AgentArgs {
            flags: report_flags(&controller, &report_pki, token.path()),
            wrapper: &["faketime", "-f", &skew],
            // Timers stay on the real monotonic clock; only wall-clock time is skewed.
            envs: vec![("FAKETIME_DONT_FAKE_MONOTONIC", "1")],
            ..AgentArgs::default()
        },
    );

    let agents: Api<NodeAgent> = Api::all(client.clone());
    let measured = await_condition(&agents, &node.node, "a clock sample", TIMEOUT, |agent| {
        agent
            .status
            .as_ref()
            .is_some_and(|status| status.clock_offset_nanoseconds.is_some())
    })
    .await
    .status
    .expect("status");
    let offset = measured.clock_offset_nanoseconds.expect("offset");
    let round_trip = measured.round_trip_nanoseconds.expect("round trip");
    let error = (offset - SKEW_SECONDS * 1_000_000_000).abs();
    eprintln!(
        "injected +{SKEW_SECONDS}s, measured {offset} ns, round trip {round_trip} ns, error {error} ns"
    );
    assert!(
        round_trip > 0 && round_trip < 1_000_000_000,
        "round trip {round_trip}"
    );
    assert!(
        error <= round_trip,
        "measured {offset} ns, round trip {round_trip} ns"
    );
    assert_eq!(
        measured.clock_offset,
        Some(custody_controller::node_agents::format_offset(offset))
    );

    let _ = agents.delete(&node.node, &DeleteParams::default()).await;
    node.delete().await;
    namespace.delete().await;
}

/// Test hygiene (issue 15): a controller scoped to one namespace marks silent only the nodes
/// whose agents reported to it; another controller's nodes are not its to judge.
#[tokio::test]
async fn a_namespaced_controller_leaves_other_controllers_nodes_alone() {
    let namespace = TestNamespace::create("othernodes").await;
    let client = namespace.client.clone();
    let agents: Api<NodeAgent> = Api::all(client.clone());
    let node = format!("{}-elsewhere", namespace.name);
    // A node another controller hears from, last heard long ago by this one's measure.
    let created: NodeAgent = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "NodeAgent",
        "metadata": {"name": node}, "spec": {"nodeName": node},
    }))
    .unwrap();
    agents
        .create(&kube::api::PostParams::default(), &created)
        .await
        .unwrap();
    let heard = k8s_openapi::jiff::Timestamp::now().to_string();
    agents
        .patch_status(
            &node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {
                "lastHeartbeatTime": heard,
                "conditions": [{"type": "Ready", "status": "True", "reason": "HeartbeatReceived",
                                "message": "the agent reports", "lastTransitionTime": heard}],
            }})),
        )
        .await
        .unwrap();
    let pki = Pki::new(&[CONTROLLER_NAME]);
    let controller = ControllerProcess::start(
        &namespace.name,
        &pki,
        &["--agent-timeout-seconds=2".to_string()],
    );
    // Well past the timeout, several silence checks later.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = agents.get(&node).await.unwrap();
    assert_eq!(
        ready(&after),
        Some(("True".to_string(), "HeartbeatReceived".to_string())),
        "{:?}",
        after.status
    );
    drop(controller);
    agents
        .delete(&node, &DeleteParams::default())
        .await
        .unwrap();
    namespace.delete().await;
}
