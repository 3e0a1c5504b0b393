//! The real `custody-agent` and `custody-wait` binaries against the real kube-apiserver
//! (pods, TokenRequest, TokenReview) with real ext4 volumes; a fake kubelet only lays out
//! volume directories and writes pod phases.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use custody_proto::gate::VolumeState;
use custody_proto::names;
use custody_tests::agent::{
    AgentArgs, AgentProcess, WaitProcess, ask_gate, record_manifest_hash, restore_objects,
    restored_volume, service_account_signing_key,
};
use custody_tests::kubelet::{FakeKubelet, PodSpec, create_pod, pod_token, request_token};
use custody_tests::pki::{Pki, sign_jwt, stranger_key};
use custody_tests::{TestNamespace, eventually};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

fn workload<'a>(
    name: &'a str,
    node: &'a str,
    restore: &custody_tests::agent::RestoreObjects,
    claims: &'a [(&'a str, &'a str)],
) -> PodSpec<'a> {
    let restored: Vec<&str> = claims.iter().map(|(_, claim)| *claim).collect();
    PodSpec {
        name,
        node,
        service_account: "db",
        labels: json!({ names::LABEL_RESTORE_UID: restore.restore_uid() }),
        annotations: json!({
            names::ANNOTATION_RESTORE: restore.restore_name(),
            names::ANNOTATION_RESTORED_CLAIMS: restored.join(","),
        }),
        claims,
    }
}

fn prepare<'a>(
    name: &'a str,
    node: &'a str,
    restore: &custody_tests::agent::RestoreObjects,
    claims: &'a [(&'a str, &'a str)],
) -> PodSpec<'a> {
    PodSpec {
        name,
        node,
        service_account: "mover",
        labels: json!({
            names::LABEL_ROLE: names::ROLE_PREPARE_DATA,
            names::LABEL_RESTORE_UID: restore.restore_uid(),
        }),
        annotations: json!({}),
        claims,
    }
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("uid")
}

#[tokio::test]
async fn custody_wait_exits_only_after_the_volume_is_verified() {
    let namespace = TestNamespace::create("gate").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let kubelet = FakeKubelet::new(&client, &format!("{ns}-a")).await;
    let pki = Pki::new(&[names::AGENT_SERVER_NAME]);

    let objects = restore_objects(&client, ns, "pg").await;
    let (volume, hash) = restored_volume(&objects.backup_uid(), &objects.restore_uid(), 500);
    record_manifest_hash(&client, &objects.backup, &hash).await;
    let claims = [("data", "data-pg-0")];
    let pod = create_pod(
        &client,
        ns,
        workload("pg-0", &kubelet.node, &objects, &claims),
    )
    .await;
    kubelet.mount(&uid(&pod), "data", volume.path());

    let agent = AgentProcess::start(&kubelet, &pki, AgentArgs::default());
    let token = pod_token(&client, &pod, names::GATE_AUDIENCE).await;
    let mut wait = WaitProcess::start(&agent, &pki, &token);

    // No prepareData pod yet: pending, and blocked.
    wait.output.await_line("data (data-pg-0) pending", TIMEOUT);
    assert!(
        wait.running(),
        "custody-wait exited before any data was written"
    );

    // The mover runs: restoring, still blocked.
    let target = [("target", "data-pg-0")];
    create_pod(
        &client,
        ns,
        prepare("prepare-data-pg-0", &kubelet.node, &objects, &target),
    )
    .await;
    kubelet
        .set_phase(ns, "prepare-data-pg-0", "Running", 0)
        .await;
    wait.output
        .await_line("data (data-pg-0) restoring", TIMEOUT);
    assert!(
        wait.running(),
        "custody-wait exited while the volume was being written"
    );

    // The mover succeeded: the agent verifies the mounted volume and releases the pod.
    kubelet
        .set_phase(ns, "prepare-data-pg-0", "Succeeded", 0)
        .await;
    let status = wait.await_exit(TIMEOUT);
    assert!(status.success(), "custody-wait: {status}");
    let released = wait.output.await_line("released", Duration::from_secs(1));
    assert!(
        released.contains(&format!("released {ns}/pg-0: 1 volume(s) verified")),
        "{released}"
    );
    agent.logs.await_line("volume verified", TIMEOUT);
    let metrics = agent.metrics();
    assert!(
        metrics.contains("custody_agent_verifications_total{reason=\"Verified\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("custody_agent_gate_releases_total 1"),
        "{metrics}"
    );

    kubelet.delete().await;
    namespace.delete().await;
}

#[tokio::test]
async fn a_volume_that_does_not_verify_keeps_its_pod_gated_and_says_why() {
    let namespace = TestNamespace::create("gate-fail").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let kubelet = FakeKubelet::new(&client, &format!("{ns}-a")).await;
    let pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let objects = restore_objects(&client, ns, "pg").await;
    let (damaged, hash) = restored_volume(&objects.backup_uid(), &objects.restore_uid(), 50);
    record_manifest_hash(&client, &objects.backup, &hash).await;
    // One byte flipped after the manifest was written.
    let victim = damaged.path().join("base/00007");
    let mut content = std::fs::read(&victim).unwrap();
    content[2] ^= 1;
    std::fs::write(&victim, content).unwrap();

    let damaged_claims = [("data", "data-pg-0")];
    let damaged_pod = create_pod(
        &client,
        ns,
        workload("pg-0", &kubelet.node, &objects, &damaged_claims),
    )
    .await;
    kubelet.mount(&uid(&damaged_pod), "data", damaged.path());
    // The second pod's volume directory exists but nothing is mounted there: it is the
    // node's disk, however good its content looks.
    let unmounted_claims = [("data", "data-pg-1")];
    let unmounted_pod = create_pod(
        &client,
        ns,
        workload("pg-1", &kubelet.node, &objects, &unmounted_claims),
    )
    .await;
    let on_disk = kubelet.unmounted(&uid(&unmounted_pod), "data");
    custody_tests::volumes::copy_tree(damaged.path(), &on_disk);
    // The third pod's mover failed.
    let failed_claims = [("data", "data-pg-2")];
    let failed_pod = create_pod(
        &client,
        ns,
        workload("pg-2", &kubelet.node, &objects, &failed_claims),
    )
    .await;

    let agent = AgentProcess::start(&kubelet, &pki, AgentArgs::default());
    let mut waits = Vec::new();
    for pod in [&damaged_pod, &unmounted_pod, &failed_pod] {
        let token = pod_token(&client, pod, names::GATE_AUDIENCE).await;
        waits.push(WaitProcess::start(&agent, &pki, &token));
    }
    for (index, claim) in ["data-pg-0", "data-pg-1", "data-pg-2"].iter().enumerate() {
        let name = format!("prepare-{index}");
        let target = [("target", *claim)];
        create_pod(
            &client,
            ns,
            prepare(&name, &kubelet.node, &objects, &target),
        )
        .await;
        let (phase, exit) = if index == 2 {
            ("Failed", 3)
        } else {
            ("Succeeded", 0)
        };
        kubelet.set_phase(ns, &name, phase, exit).await;
    }

    let mismatch = waits[0].output.await_line("[ContentMismatch]", TIMEOUT);
    assert!(mismatch.contains("base/00007"), "{mismatch}");
    let unmounted = waits[1].output.await_line("[NotAMountPoint]", TIMEOUT);
    assert!(unmounted.contains("not a mount point"), "{unmounted}");
    let failed = waits[2].output.await_line("[PrepareDataFailed]", TIMEOUT);
    assert!(failed.contains("exit code 3"), "{failed}");
    // A failed volume is never a release: the pods stay blocked.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for wait in &mut waits {
        assert!(wait.running(), "custody-wait exited on a failed volume");
        assert!(
            !wait
                .output
                .all()
                .iter()
                .any(|line| line.contains("released"))
        );
    }
    let metrics = agent.metrics();
    for reason in ["ContentMismatch", "NotAMountPoint"] {
        assert!(
            metrics.contains(&format!(
                "custody_agent_verifications_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
    assert!(
        metrics.contains("custody_agent_volumes{state=\"Failed\"} 3"),
        "{metrics}"
    );

    kubelet.delete().await;
    namespace.delete().await;
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

#[tokio::test]
async fn the_gate_answers_a_pod_only_about_itself_and_only_on_its_node() {
    let namespace = TestNamespace::create("gate-authn").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let node_a = FakeKubelet::new(&client, &format!("{ns}-a")).await;
    let node_b = FakeKubelet::new(&client, &format!("{ns}-b")).await;
    let pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let objects = restore_objects(&client, ns, "pg").await;

    // A: not under restore. B: gated. C: gated, on the other node.
    let plain = create_pod(
        &client,
        ns,
        PodSpec {
            name: "a",
            node: &node_a.node,
            service_account: "db",
            ..PodSpec::default()
        },
    )
    .await;
    let claims_b = [("data", "data-b")];
    let gated = create_pod(
        &client,
        ns,
        workload("b", &node_a.node, &objects, &claims_b),
    )
    .await;
    let claims_c = [("data", "data-c")];
    let elsewhere = create_pod(
        &client,
        ns,
        workload("c", &node_b.node, &objects, &claims_c),
    )
    .await;
    let agent = AgentProcess::start(&node_a, &pki, AgentArgs::default());

    // Each pod hears about itself, and only itself.
    let token_a = pod_token(&client, &plain, names::GATE_AUDIENCE).await;
    let answer_a = ask_gate(agent.gate, &pki, Some(&token_a))
        .await
        .expect("pod a");
    assert_eq!(answer_a.pod, format!("{ns}/a"));
    assert!(answer_a.released && answer_a.volumes.is_empty());
    let token_b = pod_token(&client, &gated, names::GATE_AUDIENCE).await;
    let answer_b = ask_gate(agent.gate, &pki, Some(&token_b))
        .await
        .expect("pod b");
    assert_eq!(answer_b.pod, format!("{ns}/b"));
    assert!(!answer_b.released);
    assert_eq!(answer_b.volumes[0].state, VolumeState::Pending as i32);

    let code = |result: Result<_, tonic::Status>| match result {
        Ok(answer) => panic!("answered: {answer:?}"),
        Err(status) => (status.code(), status.message().to_string()),
    };

    // A pod on another node.
    let token_c = pod_token(&client, &elsewhere, names::GATE_AUDIENCE).await;
    let (refused, message) = code(ask_gate(agent.gate, &pki, Some(&token_c)).await);
    assert_eq!(refused, tonic::Code::PermissionDenied, "{message}");
    assert!(message.contains(&node_b.node), "{message}");

    // A token for another audience.
    let other_audience = pod_token(&client, &gated, "https://kubernetes.default.svc").await;
    let (refused, message) = code(ask_gate(agent.gate, &pki, Some(&other_audience)).await);
    assert_eq!(refused, tonic::Code::Unauthenticated, "{message}");

    // A ServiceAccount token bound to no pod.
    let unbound = request_token(&client, ns, "db", names::GATE_AUDIENCE, None).await;
    let (refused, message) = code(ask_gate(agent.gate, &pki, Some(&unbound)).await);
    assert_eq!(refused, tonic::Code::PermissionDenied, "{message}");
    assert!(message.contains("not bound to a pod"), "{message}");

    // No token at all.
    let (refused, _) = code(ask_gate(agent.gate, &pki, None).await);
    assert_eq!(refused, tonic::Code::Unauthenticated);

    // An expired token, signed with the cluster's real key; and a forged one, with claims
    // that would be valid, signed with a key the API server does not know.
    let claims = |exp: i64| {
        json!({
            "iss": "https://kubernetes.default.svc",
            "sub": format!("system:serviceaccount:{ns}:db"),
            "aud": [names::GATE_AUDIENCE],
            "iat": exp - 3600, "nbf": exp - 3600, "exp": exp,
            "kubernetes.io": {
                "namespace": ns,
                "serviceaccount": {"name": "db", "uid": "00000000-0000-0000-0000-000000000000"},
                "pod": {"name": "b", "uid": uid(&gated)},
                "node": {"name": node_a.node},
            },
        })
    };
    let expired = sign_jwt(&claims(unix_now() - 120), &service_account_signing_key());
    let (refused, message) = code(ask_gate(agent.gate, &pki, Some(&expired)).await);
    assert_eq!(refused, tonic::Code::Unauthenticated, "{message}");
    let keys = tempfile::tempdir().unwrap();
    let forged = sign_jwt(&claims(unix_now() + 3600), &stranger_key(keys.path()));
    let (refused, message) = code(ask_gate(agent.gate, &pki, Some(&forged)).await);
    assert_eq!(refused, tonic::Code::Unauthenticated, "{message}");

    // The token of a deleted pod dies with it.
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete("b", &DeleteParams::default().grace_period(0))
        .await
        .expect("deleting pod b");
    // The agent forgets the pod at once; the API server then refuses the token itself.
    eventually(
        "the API server to refuse pod b's token",
        TIMEOUT,
        || async {
            match ask_gate(agent.gate, &pki, Some(&token_b)).await {
                Err(status) if status.code() == tonic::Code::Unauthenticated => Ok(()),
                // The agent forgot the pod: a token naming it is not even reviewed.
                Err(status)
                    if status.code() == tonic::Code::PermissionDenied
                        && status.message().contains("is not on this agent's node") =>
                {
                    Ok(())
                }
                Err(status) if status.code() == tonic::Code::PermissionDenied => {
                    Err(format!("refused by the agent: {}", status.message()))
                }
                // The API server's token check reads pods through a cache: a token of a pod
                // deleted a moment ago may still pass once; it must not pass for long.
                Ok(progress) => Err(format!("still answered: {progress:?}")),
                Err(status) => panic!("pod b's token after deletion: {status:?}"),
            }
        },
    )
    .await;

    let metrics = agent.metrics();
    for reason in ["OtherNode", "Unauthenticated", "NotBoundToPod", "NoToken"] {
        assert!(
            metrics.contains(&format!("reason=\"{reason}\"")),
            "{reason} not counted: {metrics}"
        );
    }

    node_a.delete().await;
    node_b.delete().await;
    namespace.delete().await;
}

/// A counter's value in Prometheus text (`name` with its labels, as exported), 0 if absent.
fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Issue 23: 1,000 junk calls cost the API server no TokenReview and the agent little memory.
/// Each bearer token is looked at before it is reviewed: junk, another audience and expired
/// tokens are refused at once; 100 forged tokens (the right claims, a stranger's signature)
/// can only be told apart by the API server, and at most eight of their reviews run at once
/// (the rest refused `ResourceExhausted`). Then 1,000 connections opened at once from one
/// address: at most 32 stay open (the rest are closed at once), and the agent's memory hardly
/// moves. The gate still answers a real pod afterwards.
#[tokio::test]
async fn junk_calls_to_the_gate_are_refused_before_any_token_review() {
    let namespace = TestNamespace::create("gate-junk").await;
    let client = namespace.client.clone();
    let ns = namespace.name.as_str();
    let node = FakeKubelet::new(&client, &format!("{ns}-a")).await;
    let pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let pod = create_pod(
        &client,
        ns,
        PodSpec {
            name: "a",
            node: &node.node,
            service_account: "db",
            ..PodSpec::default()
        },
    )
    .await;
    let agent = AgentProcess::start(&node, &pki, AgentArgs::default());
    let token = pod_token(&client, &pod, names::GATE_AUDIENCE).await;
    ask_gate(agent.gate, &pki, Some(&token))
        .await
        .expect("the pod's own call");
    let pid = agent.child.0.as_ref().expect("running").id();
    let (memory_before, metrics_before) = (custody_tests::peak_rss_kib(pid), agent.metrics());

    let claims = |audience: &str, exp: i64| {
        json!({
            "iss": "https://kubernetes.default.svc",
            "sub": format!("system:serviceaccount:{ns}:db"),
            "aud": [audience], "iat": exp - 3600, "exp": exp,
            "kubernetes.io": {"namespace": ns, "pod": {"name": "a", "uid": uid(&pod)},
                              "node": {"name": node.node}},
        })
    };
    let keys = tempfile::tempdir().unwrap();
    let stranger = stranger_key(keys.path());
    let now = unix_now();
    let other_audience = sign_jwt(
        &claims("https://kubernetes.default.svc", now + 600),
        &stranger,
    );
    let expired = sign_jwt(&claims(names::GATE_AUDIENCE, now - 60), &stranger);
    let forged = sign_jwt(&claims(names::GATE_AUDIENCE, now + 600), &stranger);
    let tokens: Vec<String> = (0..1000)
        .map(|index| match index % 10 {
            0 => forged.clone(),
            1..=3 => other_audience.clone(),
            4..=6 => expired.clone(),
            _ => format!("junk-{index}"),
        })
        .collect();
    use futures::StreamExt;
    let answers: Vec<_> = futures::stream::iter(tokens.iter())
        .map(|token| ask_gate(agent.gate, &pki, Some(token)))
        .buffer_unordered(8)
        .collect()
        .await;
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for answer in answers {
        match answer {
            Ok(answer) => panic!("a junk call was answered: {answer:?}"),
            Err(status) => *codes.entry(format!("{:?}", status.code())).or_default() += 1,
        }
    }
    // 1,000 connections at once from this one address, held without a word.
    let mut held = Vec::new();
    for _ in 0..1000 {
        if let Ok(stream) = tokio::net::TcpStream::connect(agent.gate).await {
            held.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut open = 0;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        use tokio::io::AsyncReadExt;
        // Closed by the agent: end of stream at once; kept: nothing to read.
        let read = tokio::time::timeout(Duration::from_millis(20), stream.read(&mut byte));
        if read.await.is_err() {
            open += 1;
        }
    }
    drop(held);
    let metrics = agent.metrics();
    let reviews = counter(&metrics, "custody_agent_gate_token_reviews_total")
        - counter(&metrics_before, "custody_agent_gate_token_reviews_total");
    let grown = custody_tests::peak_rss_kib(pid).saturating_sub(memory_before);
    eprintln!(
        "1000 junk gate calls: {codes:?}; TokenReviews {reviews}; 1000 connections at once: {open} kept open; agent peak RSS {memory_before} KiB -> +{grown} KiB"
    );
    assert!(
        open <= custody_kube::grpc::MAX_CONNECTIONS_PER_PEER,
        "{open} of 1000 idle connections from one address kept open"
    );
    assert!(
        reviews <= 100.0,
        "{reviews} TokenReviews for 100 forged tokens"
    );
    for (reason, at_least) in [
        ("MalformedToken", 300.0),
        ("WrongAudience", 300.0),
        ("TokenExpired", 300.0),
    ] {
        let series = format!("custody_agent_gate_refusals_total{{reason=\"{reason}\"}}");
        let refused = counter(&metrics, &series) - counter(&metrics_before, &series);
        assert!(
            refused >= at_least,
            "{reason}: {refused} refused\n{metrics}"
        );
    }
    assert!(
        grown < 16 << 10,
        "1000 junk calls grew the agent's peak memory {grown} KiB"
    );
    // Still answering.
    let answer = ask_gate(agent.gate, &pki, Some(&token))
        .await
        .expect("the pod's own call after the junk");
    assert_eq!(answer.pod, format!("{ns}/a"));
    node.delete().await;
    namespace.delete().await;
}
