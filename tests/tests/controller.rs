//! The real `custody-controller` binary against a real kube-apiserver: health and metrics
//! endpoints, the unknown-annotation rule, and a clean exit on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use custody_controller::conditions::{reasons, types};
use custody_kube::api::{Backup, Cluster, HasConditions};
use custody_tests::{
    ChildGuard, TestNamespace, await_condition, binary, control_plane, eventually, free_port,
};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);

fn start_controller(namespace: &str, port: u16) -> ChildGuard {
    let child = Command::new(binary("custody-controller"))
        .args(["run", "--namespace", namespace, "--log-format", "json"])
        .arg(format!("--kubeconfig={}", control_plane().display()))
        .arg(format!("--http-address=127.0.0.1:{port}"))
        .arg(format!("--report-address=127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting custody-controller");
    ChildGuard(Some(child))
}

async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let output = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            &format!("http://127.0.0.1:{port}{path}"),
        ])
        .output()
        .await
        .map_err(|error| error.to_string())?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let (body, code) = text
        .rsplit_once('\n')
        .ok_or_else(|| format!("no status in {text:?}"))?;
    let code = code
        .parse()
        .map_err(|_| format!("bad status in {text:?}"))?;
    Ok((code, body.to_string()))
}

async fn warning_events(namespace: &TestNamespace, name: &str, reason: &str) -> Vec<Event> {
    let events: kube::Api<Event> = namespace.api();
    events
        .list(&ListParams::default())
        .await
        .expect("listing events")
        .items
        .into_iter()
        .filter(|event| {
            event
                .regarding
                .as_ref()
                .and_then(|regarding| regarding.name.as_deref())
                == Some(name)
                && event.reason.as_deref() == Some(reason)
        })
        .collect()
}

fn annotation_condition<K: HasConditions>(object: &K) -> Option<(String, String, String)> {
    object
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::ANNOTATIONS_RECOGNIZED)
        .map(|condition| {
            (
                condition.status.clone(),
                condition.reason.clone(),
                condition.message.clone(),
            )
        })
}

#[tokio::test]
async fn unknown_custody_annotations_are_reported_and_cleared() {
    let namespace = TestNamespace::create("annotations").await;
    let port = free_port();
    let mut controller = start_controller(&namespace.name, port);

    let body = eventually("/readyz answering 200", TIMEOUT, || async {
        match http_get(port, "/readyz").await? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    assert_eq!(body, "ok");
    let (code, _) = http_get(port, "/healthz").await.expect("/healthz");
    assert_eq!(code, 200);

    let clusters = namespace.api::<Cluster>();
    let cluster = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Cluster",
        "metadata": { "name": "db", "annotations": {
            "custody.io/restore-from": "backup-1",
            "app.example.com/owner": "team-a"
        } },
        "spec": { "statefulSetRef": { "name": "db" }, "volumeClaimTemplates": ["data"] }
    }))
    .expect("cluster");
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create Cluster");

    let reported = await_condition(
        &clusters,
        "db",
        "AnnotationsRecognized=False",
        TIMEOUT,
        |cluster| annotation_condition(cluster).is_some_and(|(status, _, _)| status == "False"),
    )
    .await;
    let (_, reason, message) = annotation_condition(&reported).expect("condition");
    assert_eq!(reason, reasons::UNKNOWN_ANNOTATION);
    assert!(message.contains("custody.io/restore-from"), "{message}");
    assert!(
        !message.contains("app.example.com"),
        "only custody's domain is checked: {message}"
    );

    let events = eventually("a Warning Event", TIMEOUT, || async {
        let events = warning_events(&namespace, "db", "UnknownAnnotation").await;
        if events.is_empty() {
            Err("no UnknownAnnotation event".to_string())
        } else {
            Ok(events)
        }
    })
    .await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        events[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("custody.io/restore-from")
    );
    assert_eq!(
        events[0].reporting_controller.as_deref(),
        Some("custody-controller")
    );

    // A known annotation on the wrong kind is reported too; on its own kind it is accepted.
    let backups = namespace.api::<Backup>();
    let backup = serde_json::from_value(json!({
        "apiVersion": "custody.io/v1alpha1", "kind": "Backup",
        "metadata": { "name": "db-1", "annotations": { "custody.io/skip-artifact-cleanup": "true" } },
        "spec": { "clusterRef": { "name": "db" } }
    }))
    .expect("backup");
    backups
        .create(&PostParams::default(), &backup)
        .await
        .expect("create Backup");
    await_condition(
        &backups,
        "db-1",
        "AnnotationsRecognized=True",
        TIMEOUT,
        |backup| annotation_condition(backup).is_some_and(|(status, _, _)| status == "True"),
    )
    .await;
    let misplaced =
        json!({ "metadata": { "annotations": { "custody.io/skip-artifact-cleanup": "true" } } });
    clusters
        .patch("db", &PatchParams::default(), &Patch::Merge(&misplaced))
        .await
        .expect("annotate");
    let both = await_condition(&clusters, "db", "both problems named", TIMEOUT, |cluster| {
        annotation_condition(cluster)
            .is_some_and(|(_, _, message)| message.contains("skip-artifact-cleanup"))
    })
    .await;
    let (status, _, message) = annotation_condition(&both).expect("condition");
    assert_eq!(status, "False");
    assert!(message.contains("custody.io/restore-from"), "{message}");

    // Removing the annotations clears the condition; its transition time moves.
    let before = both
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::ANNOTATIONS_RECOGNIZED)
        .expect("condition")
        .last_transition_time
        .clone();
    let remove = json!({ "metadata": { "annotations": {
        "custody.io/restore-from": null, "custody.io/skip-artifact-cleanup": null
    } } });
    clusters
        .patch("db", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .expect("remove");
    let cleared = await_condition(
        &clusters,
        "db",
        "AnnotationsRecognized=True",
        TIMEOUT,
        |cluster| annotation_condition(cluster).is_some_and(|(status, _, _)| status == "True"),
    )
    .await;
    let (_, reason, _) = annotation_condition(&cleared).expect("condition");
    assert_eq!(reason, reasons::ANNOTATIONS_RECOGNIZED);
    let after = cleared
        .conditions()
        .iter()
        .find(|condition| condition.type_ == types::ANNOTATIONS_RECOGNIZED)
        .expect("condition")
        .last_transition_time
        .clone();
    assert!(after >= before);
    eventually("a Normal AnnotationsRecognized event", TIMEOUT, || async {
        let events = warning_events(&namespace, "db", "AnnotationsRecognized").await;
        if events.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(())
        }
    })
    .await;

    let (code, metrics) = http_get(port, "/metrics").await.expect("/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("custody_controller_reconciliations_total{kind=\"Cluster\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("custody_controller_warning_events_total{kind=\"Cluster\"}"),
        "{metrics}"
    );

    // The namespace goes while the controller runs (its finalizers are the controller's).
    namespace.delete().await;
    let status = controller
        .terminate(Duration::from_secs(10))
        .expect("exits within 10 s of SIGTERM");
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
}

/// Issue 23: the controller's memory does not grow with Secrets it does not use. It neither
/// lists nor watches Secrets (its ClusterRole has no such verb): a repository reads its own by
/// name at each check, every 30 s. 200 unrelated Secrets of 256 KiB (50 MiB) leave a controller
/// started among them near the peak memory of one started before them, in the same run.
/// Watching whole Secrets, the first list alone carried all 50 MiB (base64 in JSON, then
/// decoded) through its memory.
#[tokio::test]
async fn unrelated_secrets_do_not_grow_the_controllers_memory() {
    let namespace = TestNamespace::create("secrets-memory").await;
    let ns = namespace.name.clone();
    let repositories = namespace.api::<custody_kube::api::BackupRepository>();
    repositories
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "custody.io/v1alpha1", "kind": "BackupRepository",
                "metadata": {"name": "watched"},
                "spec": {"endpoint": "http://127.0.0.1:1", "bucket": "bkt",
                         "credentialsSecretRef": {"name": "late-credentials"}}}))
            .unwrap(),
        )
        .await
        .expect("create BackupRepository");
    let ready = |port: u16| async move {
        eventually("/readyz answering 200", TIMEOUT, || async {
            match http_get(port, "/readyz").await? {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        })
        .await;
    };
    let reason = |reason: &'static str| {
        let repositories = repositories.clone();
        async move {
            await_condition(
                &repositories,
                "watched",
                reason,
                TIMEOUT,
                move |repository: &custody_kube::api::BackupRepository| {
                    repository
                        .status
                        .as_ref()
                        .and_then(|status| {
                            status
                                .conditions
                                .iter()
                                .find(|condition| condition.type_ == "Ready")
                        })
                        .is_some_and(|ready| ready.reason == reason)
                },
            )
            .await;
        }
    };

    let port = free_port();
    let mut before = start_controller(&ns, port);
    ready(port).await;
    reason("SecretNotFound").await;
    let before_pid = before.0.as_ref().expect("running").id();
    let baseline = custody_tests::peak_rss_kib(before_pid);
    before.terminate(Duration::from_secs(10));

    let secrets = namespace.api::<k8s_openapi::api::core::v1::Secret>();
    let filler = "x".repeat(256 << 10);
    for index in 0..200 {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("unrelated-{index}")},
                    "stringData": {"blob": filler},
                }))
                .unwrap(),
            )
            .await
            .expect("create Secret");
    }
    let port = free_port();
    let mut among = start_controller(&ns, port);
    ready(port).await;
    // The credentials appearing are read at the repository's next check.
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "late-credentials"},
                "stringData": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
            }))
            .unwrap(),
        )
        .await
        .expect("create Secret");
    reason("EndpointUnreachable").await;
    let peak = custody_tests::peak_rss_kib(among.0.as_ref().expect("running").id());
    among.terminate(Duration::from_secs(10));
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "controller peak RSS: {baseline} KiB started before 200 Secrets of 256 KiB (50 MiB), {peak} KiB started among them: +{grown} KiB"
    );
    assert!(
        grown < 25 << 10,
        "the controller's peak memory grew {grown} KiB with 50 MiB of Secrets it does not use"
    );
    namespace.delete().await;
}
