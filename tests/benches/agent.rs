//! Agent benchmarks against the real control plane (`hack/bench-agent.sh` runs them):
//!
//! - gate release latency: from the moment the agent finished verifying a volume (its own
//!   timestamp, sent in the gate's final message) to the exit of `custody-wait`, over `RUNS`
//!   pods; baseline in the same run: the marker-file gate people use today, a shell loop
//!   that checks once a second, from the marker's creation to the loop's exit;
//! - the agent's idle resident memory and CPU with `IDLE_PODS` pods on its node; baseline in
//!   the same run: `kubectl get pods --watch` on the same node's pods.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use custody_proto::names;
use custody_tests::agent::{
    AgentArgs, AgentProcess, CONTROLLER_NAME, ControllerProcess, RestoreObjects, WaitProcess,
    record_manifest_hash, report_flags, report_token, restore_objects, restored_volume,
};
use custody_tests::kubelet::{FakeKubelet, PodSpec, create_pod, pod_token};
use custody_tests::pki::Pki;
use custody_tests::{ChildGuard, TestNamespace, control_plane, kubectl_path};
use serde_json::json;

const RUNS: usize = 100;
const BASELINE_RUNS: usize = 20;
const IDLE_PODS: usize = 50;
const IDLE_SECONDS: u64 = 30;

fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(name: &str, mut millis: Vec<f64>) -> (f64, f64) {
    millis.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&millis, 50.0), percentile(&millis, 99.0));
    println!(
        "{name}: runs {} p50 {p50:.2} ms p99 {p99:.2} ms min {:.2} ms max {:.2} ms",
        millis.len(),
        millis[0],
        millis[millis.len() - 1]
    );
    (p50, p99)
}

/// Waits for the child's exit on a thread and returns the Unix time of the exit.
fn exit_time(mut child: std::process::Child) -> mpsc::Receiver<(i64, std::process::ExitStatus)> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait().expect("waiting");
        let _ = sender.send((unix_nanos(), status));
    });
    receiver
}

async fn gate_latency(
    namespace: &TestNamespace,
    kubelet: &FakeKubelet,
    pki: &Pki,
    objects: &RestoreObjects,
    volume: &std::path::Path,
) -> Vec<f64> {
    let client = &namespace.client;
    let ns = namespace.name.as_str();
    let agent = AgentProcess::start(kubelet, pki, AgentArgs::default());
    let mut latencies = Vec::new();
    for run in 0..RUNS {
        let pod_name = format!("pg-{run}");
        let claim = format!("data-{pod_name}");
        let claims = [("data", claim.as_str())];
        let pod = create_pod(
            client,
            ns,
            PodSpec {
                name: &pod_name,
                node: &kubelet.node,
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
        let uid = pod.metadata.uid.clone().expect("uid");
        kubelet.mount(&uid, "data", volume);
        let token = pod_token(client, &pod, names::GATE_AUDIENCE).await;
        let mut wait = WaitProcess::start(&agent, pki, &token);
        wait.output.await_line("pending", Duration::from_secs(30));
        let child = wait.child.0.take().expect("running");
        let exited = exit_time(child);

        let prepare = format!("prepare-{run}");
        let target = [("target", claim.as_str())];
        create_pod(
            client,
            ns,
            PodSpec {
                name: &prepare,
                node: &kubelet.node,
                service_account: "mover",
                labels: json!({
                    names::LABEL_ROLE: names::ROLE_PREPARE_DATA,
                    names::LABEL_RESTORE_UID: objects.restore_uid(),
                }),
                annotations: json!({}),
                claims: &target,
            },
        )
        .await;
        kubelet.set_phase(ns, &prepare, "Succeeded", 0).await;
        let (exit_nanos, status) = exited
            .recv_timeout(Duration::from_secs(30))
            .expect("custody-wait exits");
        assert!(status.success(), "custody-wait: {status}");
        let line = wait
            .output
            .await_line("verified_at_unix_nanos=", Duration::from_secs(5));
        let verified_at: i64 = line
            .rsplit('=')
            .next()
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no verification time in {line:?}"));
        latencies.push((exit_nanos - verified_at) as f64 / 1e6);
    }
    latencies
}

fn polling_baseline() -> Vec<f64> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let marker = dir.path().join("restore-complete");
    let mut latencies = Vec::new();
    for run in 0..BASELINE_RUNS {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "until [ -f '{}' ]; do sleep 1; done",
                marker.display()
            ))
            .spawn()
            .expect("sh");
        let exited = exit_time(child);
        // Data arrives at some point within the poll interval.
        std::thread::sleep(Duration::from_millis(137 + (run as u64 * 379) % 1000));
        let created = unix_nanos();
        std::fs::write(&marker, b"").expect("marker");
        let (exit_nanos, _) = exited.recv_timeout(Duration::from_secs(5)).expect("exit");
        latencies.push((exit_nanos - created) as f64 / 1e6);
        std::fs::remove_file(&marker).expect("marker");
    }
    latencies
}

/// Resident memory in KiB (total, anonymous) of process `pid`.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// CPU time of every thread of process `pid`, in nanoseconds (from schedstat).
fn cpu_nanos(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(|task| {
            let path = task.ok()?.path().join("schedstat");
            std::fs::read_to_string(path)
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn idle(name: &str, pid: u32) -> (f64, f64) {
    let before = cpu_nanos(pid);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(IDLE_SECONDS));
    let used = cpu_nanos(pid) - before;
    let (rss, anonymous) = memory(pid);
    let cpu = used as f64 / started.elapsed().as_nanos() as f64 * 100.0;
    let rss_mib = rss as f64 / 1024.0;
    println!(
        "{name}: idle RSS {rss_mib:.1} MiB ({:.1} MiB anonymous), CPU {cpu:.4}% of one core ({:.1} ms over {IDLE_SECONDS} s)",
        anonymous as f64 / 1024.0,
        used as f64 / 1e6
    );
    (rss_mib, cpu)
}

async fn idle_usage(namespace: &TestNamespace, kubelet: &FakeKubelet, pki: &Pki) {
    let ns = namespace.name.as_str();
    for index in 0..IDLE_PODS {
        create_pod(
            &namespace.client,
            ns,
            PodSpec {
                name: &format!("idle-{index}"),
                node: &kubelet.node,
                service_account: "db",
                ..PodSpec::default()
            },
        )
        .await;
    }
    // Reporting to a controller as in production, at the default heartbeat and clock
    // intervals.
    let report_pki = Pki::new(&[CONTROLLER_NAME]);
    let controller = ControllerProcess::start(
        ns,
        &report_pki,
        &[format!("--agent-service-account={ns}:custody-agent")],
    );
    let token = report_token(&namespace.client, ns, &kubelet.node).await;
    let mut flags = report_flags(&controller, &report_pki, token.path());
    flags.retain(|flag| !flag.starts_with("--heartbeat") && !flag.starts_with("--clock"));
    let agent = AgentProcess::start(
        kubelet,
        pki,
        AgentArgs {
            flags,
            ..AgentArgs::default()
        },
    );
    let watch = Command::new(kubectl_path())
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .args([
            "get",
            "pods",
            "--all-namespaces",
            "--watch",
            "--field-selector",
        ])
        .arg(format!("spec.nodeName={}", kubelet.node))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl");
    let watch = ChildGuard(Some(watch));
    std::thread::sleep(Duration::from_secs(5));
    let agent_pid = agent.child.0.as_ref().expect("agent").id();
    let watch_pid = watch.0.as_ref().expect("kubectl").id();
    let (agent_rss, agent_cpu) = idle(
        &format!("custody-agent ({IDLE_PODS} pods on its node)"),
        agent_pid,
    );
    let (kubectl_rss, kubectl_cpu) =
        idle("baseline kubectl get pods --watch (same pods)", watch_pid);
    let reports = agent
        .metrics()
        .lines()
        .find(|line| line.starts_with("custody_agent_reports_total{reason=\"Sent\"}"))
        .unwrap_or("no reports sent")
        .to_string();
    assert!(
        reports.contains("Sent"),
        "the agent did not report: {reports}"
    );
    println!("agent reported while idle: {reports}");
    println!(
        "idle: agent/kubectl RSS {:.2}x; agent {agent_rss:.1} MiB (target <= 15 MiB), CPU {agent_cpu:.4}% (kubectl {kubectl_rss:.1} MiB, {kubectl_cpu:.4}%)",
        agent_rss / kubectl_rss
    );
}

#[tokio::main]
async fn main() {
    let namespace = TestNamespace::create("bench").await;
    let kubelet = FakeKubelet::new(&namespace.client, &format!("{}-bench", namespace.name)).await;
    let pki = Pki::new(&[names::AGENT_SERVER_NAME]);
    let objects = restore_objects(&namespace.client, &namespace.name, "pg").await;
    let (volume, hash) = restored_volume(&objects.backup_uid(), &objects.restore_uid(), 100);
    record_manifest_hash(&namespace.client, &objects.backup, &hash).await;

    let gate = gate_latency(&namespace, &kubelet, &pki, &objects, volume.path()).await;
    let baseline = polling_baseline();
    let (_, gate_p99) = summary("custody gate: verification done -> custody-wait exit", gate);
    let (baseline_p50, _) = summary("baseline: 1 s marker-file poll, marker -> exit", baseline);
    println!("gate p99 {gate_p99:.2} ms (target <= 50 ms); baseline p50 {baseline_p50:.0} ms");

    let idle_kubelet =
        FakeKubelet::new(&namespace.client, &format!("{}-idle", namespace.name)).await;
    idle_usage(&namespace, &idle_kubelet, &pki).await;

    let agents: kube::Api<custody_kube::api::NodeAgent> = kube::Api::all(namespace.client.clone());
    let _ = agents.delete(&idle_kubelet.node, &Default::default()).await;
    kubelet.delete().await;
    idle_kubelet.delete().await;
    namespace.delete().await;
}
