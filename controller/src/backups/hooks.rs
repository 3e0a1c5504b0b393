//! The application's hooks around a copy (method `Hooks`): what runs next, a pure rule; and
//! running one through the API server (pods/exec).
//!
//! The pre hook runs before the Job is created; the copy starts only after it succeeded (or
//! failed with `onError: Continue`). The post hook runs once the Job ended, whatever its end,
//! and also after a pre hook whose failure skipped the copy. Each result is recorded in
//! `status.hooks` before the next step, so a restarted controller goes on from there (a hook
//! whose result was not recorded yet runs again: hooks run at least once).

use std::time::Duration;

use custody_kube::api::{Hook, HookOnError, HookResult, Hooks, HooksStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, AttachParams};

use super::consistency::Mounter;

/// The Backup's reason when its pre hook failed (`onError: Fail`).
pub const PRE_HOOK_FAILED: &str = "PreHookFailed";
/// The Backup's reason when its post hook failed (`onError: Fail`).
pub const POST_HOOK_FAILED: &str = "PostHookFailed";
/// How long a hook may run when it does not say.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 30;

/// Which hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Pre,
    Post,
}

/// A hook to run now, in `pod` (or why it cannot run: see [`target`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub phase: Phase,
    pub hook: Hook,
    pub pod: Result<String, String>,
}

/// The pod a hook runs in: the running pod that mounts the claim (`mounter`), and only when
/// it is a pod of the Cluster's own StatefulSet (`stateful_set`, `None` when the Cluster is
/// gone). A hook is a command of the application's, checked at admission against what its
/// writer may exec in the namespace: custody runs it in no other pod that happens to mount
/// the claim.
pub fn target(mounter: Option<&Mounter>, stateful_set: Option<&str>) -> Result<String, String> {
    let Some(mounter) = mounter else {
        return Err("no running pod mounts the claim, so the hook could not run".into());
    };
    let Some(stateful_set) = stateful_set else {
        return Err(format!(
            "the Cluster is gone, so pod {} cannot be shown to be its application's: the hook did not run",
            mounter.pod
        ));
    };
    match &mounter.stateful_set {
        Some(owner) if owner == stateful_set => Ok(mounter.pod.clone()),
        owner => Err(format!(
            "pod {} mounts the claim but is {}, not a pod of the Cluster's StatefulSet {stateful_set}: hooks run only in the Cluster's own pods, so the hook did not run",
            mounter.pod,
            match owner {
                Some(owner) => format!("a pod of StatefulSet {owner}"),
                None => "controlled by no StatefulSet".to_string(),
            }
        )),
    }
}

/// Before the copy: what comes next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    RunPre,
    Copy,
    /// The pre hook failed with `onError: Fail`: no copy; the message says why.
    Skip(String),
}

/// The step before the copy, given the hooks and what ran.
pub fn before(hooks: &Hooks, ran: Option<&HooksStatus>) -> Before {
    match ran.and_then(|ran| ran.pre.as_ref()) {
        None => Before::RunPre,
        Some(result) if result.succeeded || hooks.pre.on_error == HookOnError::Continue => {
            Before::Copy
        }
        Some(result) => Before::Skip(format!(
            "the pre hook failed, so nothing was copied: {}",
            result.message
        )),
    }
}

/// After the copy (or a skipped one): what comes next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    RunPost,
    /// Done; `Some` when the post hook's failure fails the Backup.
    Done(Option<String>),
}

/// The step after the copy, given the hooks and what ran.
pub fn after(hooks: &Hooks, ran: Option<&HooksStatus>) -> After {
    let Some(post) = &hooks.post else {
        return After::Done(None);
    };
    match ran.and_then(|ran| ran.post.as_ref()) {
        None => After::RunPost,
        Some(result) if !result.succeeded && post.on_error == HookOnError::Fail => {
            After::Done(Some(format!("the post hook failed: {}", result.message)))
        }
        Some(_) => After::Done(None),
    }
}

/// The hook's bound.
pub fn timeout(hook: &Hook) -> Duration {
    let seconds = hook
        .timeout_seconds
        .and_then(|seconds| u32::try_from(seconds).ok())
        .filter(|seconds| *seconds > 0)
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    Duration::from_secs(seconds.into())
}

/// The most of a hook's output kept in its result.
const OUTPUT_LIMIT: u64 = 4096;

/// Runs `run` in its pod through the API server, within its timeout; how it went.
pub async fn exec(client: &kube::Client, namespace: &str, run: &Run) -> HookResult {
    let started_at = Time(k8s_openapi::jiff::Timestamp::now());
    let (succeeded, message) = match &run.pod {
        Err(why) => (false, why.clone()),
        Ok(pod) => {
            let limit = timeout(&run.hook);
            match tokio::time::timeout(limit, attach(client, namespace, pod, &run.hook)).await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(error)) if forbidden(&error) => (
                    false,
                    format!(
                        "custody may not exec in pod {pod}: namespace {namespace} has not granted it pods/exec; its admin binds ClusterRole {role} to custody's ServiceAccount there (as installed from deploy/: kubectl create rolebinding {role} --namespace {namespace} --clusterrole {role} --serviceaccount custody-system:custody-controller)",
                        role = crate::requester::HOOKS_ROLE
                    ),
                ),
                Ok(Err(kube::Error::Api(status))) => (
                    false,
                    format!("could not run it in pod {pod}: {}", status.message),
                ),
                Ok(Err(error)) => (false, format!("could not run it in pod {pod}: {error}")),
                Err(_) => (
                    false,
                    format!(
                        "it did not finish within {} s (it may still run in pod {pod}: the API server cannot stop it)",
                        limit.as_secs()
                    ),
                ),
            }
        }
    };
    HookResult {
        pod: run.pod.clone().unwrap_or_default(),
        succeeded,
        message: crate::events::cut(&message, 1024),
        started_at,
        finished_at: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Whether the API server refused the exec itself (403 on the upgrade): custody lacks
/// `pods/exec` in the namespace.
fn forbidden(error: &kube::Error) -> bool {
    matches!(
        error,
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
            status
        )) if status.as_u16() == 403
    ) || matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// Runs the hook's command and waits for its status: `(succeeded, exit and output)`.
async fn attach(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    hook: &Hook,
) -> Result<(bool, String), kube::Error> {
    use tokio::io::AsyncReadExt;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut params = AttachParams::default()
        .stdin(false)
        .stdout(true)
        .stderr(true);
    if let Some(container) = &hook.container {
        params = params.container(container.clone());
    }
    let mut process = pods.exec(pod, hook.command.clone(), &params).await?;
    let read = |stream: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| async move {
        let mut text = Vec::new();
        if let Some(stream) = stream {
            let _ = stream.take(OUTPUT_LIMIT).read_to_end(&mut text).await;
        }
        String::from_utf8_lossy(&text).trim().to_string()
    };
    let stdout = process
        .stdout()
        .map(|stream| Box::new(stream) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let stderr = process
        .stderr()
        .map(|stream| Box::new(stream) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let status = process.take_status();
    let (stdout, stderr, status) = tokio::join!(read(stdout), read(stderr), async {
        match status {
            Some(status) => status.await,
            None => None,
        }
    });
    let _ = process.join().await;
    Ok(outcome(
        &format!("{:?} in pod {pod}", hook.command),
        status.as_ref(),
        &stdout,
        &stderr,
    ))
}

/// How a command (`what`) ended, from the status the API server sent at its end and its
/// output: `(succeeded, its exit and output)`.
pub fn outcome(
    what: &str,
    status: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
    stdout: &str,
    stderr: &str,
) -> (bool, String) {
    let output = [stdout, stderr]
        .into_iter()
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let succeeded = status.and_then(|status| status.status.as_deref()) == Some("Success");
    let how = match status {
        Some(_) if succeeded => "exited with code 0".to_string(),
        Some(status) => match exit_code(status) {
            Some(code) => format!("exited with code {code}"),
            None => format!(
                "failed: {}",
                status.message.as_deref().unwrap_or("no reason given")
            ),
        },
        None => "ended without a status".to_string(),
    };
    let message = if output.is_empty() {
        format!("{what} {how}")
    } else {
        format!("{what} {how}: {output}")
    };
    (succeeded, message)
}

/// The exit code in a failed exec's status.
fn exit_code(status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Option<String> {
    status
        .details
        .as_ref()?
        .causes
        .iter()
        .flatten()
        .find(|cause| cause.reason.as_deref() == Some("ExitCode"))?
        .message
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(on_error: HookOnError) -> Hook {
        Hook {
            container: None,
            command: vec!["true".into()],
            timeout_seconds: None,
            on_error,
        }
    }

    fn result(succeeded: bool) -> HookResult {
        HookResult {
            pod: "db-0".into(),
            succeeded,
            message: "exited with code 3".into(),
            started_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            finished_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn ran(pre: Option<bool>, post: Option<bool>) -> HooksStatus {
        HooksStatus {
            pre: pre.map(result),
            post: post.map(result),
        }
    }

    /// A hook runs only in a running pod of the Cluster's own StatefulSet.
    #[test]
    fn a_hook_runs_only_in_a_pod_of_the_clusters_own_stateful_set() {
        let pod = |owner: Option<&str>| Mounter {
            pod: "db-0".into(),
            node: "node-a".into(),
            ip: None,
            stateful_set: owner.map(str::to_string),
        };
        let (own, other, none) = (pod(Some("db")), pod(Some("payroll")), pod(None));
        type Row<'a> = (
            Option<&'a Mounter>,
            Option<&'a str>,
            Result<&'a str, &'a str>,
        );
        let rows: [Row<'_>; 5] = [
            (Some(&own), Some("db"), Ok("db-0")),
            (None, Some("db"), Err("no running pod mounts the claim")),
            (
                Some(&other),
                Some("db"),
                Err("a pod of StatefulSet payroll, not a pod of the Cluster's StatefulSet db"),
            ),
            (Some(&none), Some("db"), Err("controlled by no StatefulSet")),
            (Some(&own), None, Err("the Cluster is gone")),
        ];
        for (mounter, stateful_set, expected) in rows {
            let found = target(mounter, stateful_set);
            match (expected, &found) {
                (Ok(expected), Ok(found)) => assert_eq!(found, expected),
                (Err(expected), Err(found)) => {
                    assert!(found.contains(expected), "{found:?} lacks {expected:?}")
                }
                _ => panic!("{mounter:?} {stateful_set:?}: {found:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_copy_waits_for_the_pre_hook_and_a_failure_skips_it_only_when_it_should() {
        let fail = Hooks {
            pre: hook(HookOnError::Fail),
            post: None,
        };
        let carry_on = Hooks {
            pre: hook(HookOnError::Continue),
            post: None,
        };
        let rows = [
            (&fail, None, "RunPre"),
            (&fail, Some(ran(None, None)), "RunPre"),
            (&fail, Some(ran(Some(true), None)), "Copy"),
            (&fail, Some(ran(Some(false), None)), "Skip"),
            (&carry_on, Some(ran(Some(false), None)), "Copy"),
            (&carry_on, Some(ran(Some(true), None)), "Copy"),
        ];
        for (hooks, ran, want) in rows {
            let got = before(hooks, ran.as_ref());
            let name = match &got {
                Before::RunPre => "RunPre",
                Before::Copy => "Copy",
                Before::Skip(message) => {
                    assert!(message.contains("exited with code 3"), "{message}");
                    "Skip"
                }
            };
            assert_eq!(name, want, "{hooks:?} {ran:?}");
        }
    }

    #[test]
    fn the_post_hook_runs_once_after_the_copy_and_fails_the_backup_only_when_it_should() {
        let with_post = |on_error| Hooks {
            pre: hook(HookOnError::Fail),
            post: Some(hook(on_error)),
        };
        let (fail, carry_on) = (
            with_post(HookOnError::Fail),
            with_post(HookOnError::Continue),
        );
        let none = Hooks {
            pre: hook(HookOnError::Fail),
            post: None,
        };
        let rows = [
            (&none, None, After::Done(None)),
            (&fail, None, After::RunPost),
            (&fail, Some(ran(Some(false), None)), After::RunPost),
            (&fail, Some(ran(Some(true), Some(true))), After::Done(None)),
            (
                &fail,
                Some(ran(Some(true), Some(false))),
                After::Done(Some("the post hook failed: exited with code 3".into())),
            ),
            (
                &carry_on,
                Some(ran(Some(true), Some(false))),
                After::Done(None),
            ),
        ];
        for (hooks, ran, want) in rows {
            assert_eq!(after(hooks, ran.as_ref()), want, "{hooks:?} {ran:?}");
        }
    }

    #[test]
    fn a_hook_succeeds_only_on_the_servers_success_and_says_how_it_ended() {
        let status =
            |value: serde_json::Value| -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Status {
                serde_json::from_value(value).unwrap()
            };
        let exited = status(
            serde_json::json!({"status": "Failure", "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}),
        );
        let refused = status(serde_json::json!({"status": "Failure",
            "message": "executable file not found in $PATH",
            "details": {"causes": [{"reason": "Other", "message": "9"}]}}));
        let success = status(serde_json::json!({"status": "Success"}));
        let rows: [(Option<&_>, &str, &str, bool, &str); 6] = [
            (Some(&success), "", "", true, "x exited with code 0"),
            (
                Some(&success),
                "done",
                "",
                true,
                "x exited with code 0: done",
            ),
            (
                Some(&exited),
                "",
                "oops",
                false,
                "x exited with code 3: oops",
            ),
            (
                Some(&exited),
                "out",
                "err",
                false,
                "x exited with code 3: out\nerr",
            ),
            (
                Some(&refused),
                "",
                "",
                false,
                "x failed: executable file not found in $PATH",
            ),
            (None, "", "", false, "x ended without a status"),
        ];
        for (status, stdout, stderr, succeeded, message) in rows {
            assert_eq!(
                outcome("x", status, stdout, stderr),
                (succeeded, message.to_string())
            );
        }
    }

    #[test]
    fn a_hook_is_bounded_by_its_seconds_or_half_a_minute() {
        let bounded = |seconds| Hook {
            timeout_seconds: seconds,
            ..hook(HookOnError::Fail)
        };
        assert_eq!(timeout(&bounded(None)), Duration::from_secs(30));
        assert_eq!(timeout(&bounded(Some(5))), Duration::from_secs(5));
        assert_eq!(timeout(&bounded(Some(0))), Duration::from_secs(30));
        assert_eq!(timeout(&bounded(Some(-1))), Duration::from_secs(30));
    }
}
