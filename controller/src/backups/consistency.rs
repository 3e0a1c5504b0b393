//! Whether a volume backup may copy its claim now, and what its copy will be: a pure rule.
//!
//! Files copied one after another while a database writes are no point in time: the restore
//! verifies (the bytes are the backup's), the database starts, and rows are gone or indexes
//! torn. So a volume backup copies a claim only while no running pod mounts it (the state the
//! application left at shutdown), or, when a pod does, by a consistency method the user chose
//! on the Backup or its Cluster; otherwise it is refused, naming the ways out.

use custody_kube::api::{BackupTool, Capture, Consistency, ConsistencyMethod, Hooks};

use crate::conditions::{Desired, Status};

/// The Backup's reason when it is refused: a running pod mounts the claim and no method says
/// how to copy it.
pub const CONSISTENCY_METHOD_REQUIRED: &str = "ConsistencyMethodRequired";
/// The Backup's reason when a pod mounting the claim started while a `Stopped` copy ran.
pub const APPLICATION_STARTED: &str = "ApplicationStartedDuringCopy";
/// The condition type that says how consistent the copy is.
pub const CONSISTENT: &str = "Consistent";

/// A running pod that mounts the claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mounter {
    pub pod: String,
    pub node: String,
    /// The pod's IP, where an application's backup tool reaches it.
    pub ip: Option<String>,
    /// The StatefulSet that controls the pod (its controller owner reference), if one does.
    pub stateful_set: Option<String>,
}

/// What a volume backup about to start does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Copy, as `capture`; on `node` when a running pod pins it there, else wherever the
    /// claim can be mounted (the scheduler places the Job).
    Copy {
        capture: Capture,
        node: Option<String>,
    },
    /// Do not copy: the Backup fails with this message.
    Refuse(String),
}

/// How long a filesystem stays frozen when the Backup does not say.
pub const DEFAULT_MAX_FREEZE_SECONDS: u32 = 60;

/// The consistency asked for: the Backup's own, else its Cluster's.
pub fn chosen<'a>(
    backup: Option<&'a Consistency>,
    cluster: Option<&'a Consistency>,
) -> Option<&'a Consistency> {
    backup.or(cluster)
}

/// The method asked for.
pub fn method(chosen: Option<&Consistency>) -> Option<ConsistencyMethod> {
    chosen.map(|consistency| consistency.method)
}

/// The longest a frozen copy may keep the filesystem frozen.
pub fn max_freeze_seconds(chosen: Option<&Consistency>) -> u32 {
    chosen
        .and_then(|consistency| consistency.max_freeze_seconds)
        .and_then(|seconds| u32::try_from(seconds).ok())
        .filter(|seconds| *seconds > 0)
        .unwrap_or(DEFAULT_MAX_FREEZE_SECONDS)
}

/// What a volume backup of `claim` (of StatefulSet `stateful_set`, Cluster `cluster`) does,
/// given the method asked for and the running pod that mounts the claim, if any.
pub fn decide(
    method: Option<ConsistencyMethod>,
    mounter: Option<&Mounter>,
    claim: &str,
    cluster: &str,
    stateful_set: &str,
) -> Decision {
    match (mounter, method) {
        (None, _) => Decision::Copy {
            capture: Capture::Stopped,
            node: None,
        },
        (Some(mounter), Some(ConsistencyMethod::Freeze)) => Decision::Copy {
            capture: Capture::Frozen,
            node: Some(mounter.node.clone()),
        },
        (Some(mounter), Some(ConsistencyMethod::Hooks)) => Decision::Copy {
            capture: Capture::Hooks,
            node: Some(mounter.node.clone()),
        },
        (Some(mounter), Some(ConsistencyMethod::Tool)) => Decision::Copy {
            capture: Capture::Tool,
            node: Some(mounter.node.clone()),
        },
        (Some(mounter), Some(ConsistencyMethod::CrashUnsafe)) => Decision::Copy {
            capture: Capture::CrashUnsafe,
            node: Some(mounter.node.clone()),
        },
        (Some(Mounter { pod, node, .. }), None) => Decision::Refuse(format!(
            "pod {pod} on node {node} is running and mounts claim {claim}: files copied while it writes are no point in time, and a database may not start from them. Stop the application (scale StatefulSet {stateful_set} to 0) and create a new Backup, or set spec.consistency on the Backup or on Cluster {cluster}: method Freeze (the filesystem frozen for the copy), Tool (the application's own backup tool), Hooks (commands in its pod before and after) or CrashUnsafe (copies anyway, knowingly)"
        )),
    }
}

/// The `Consistent` condition of a Backup whose copy was decided as `capture`.
pub fn condition(capture: Capture) -> Desired {
    match capture {
        Capture::Stopped => Desired {
            type_: CONSISTENT,
            status: Status::True,
            reason: "ApplicationStopped",
            message: "no running pod mounted the claim when the copy started".into(),
        },
        Capture::Frozen => Desired {
            type_: CONSISTENT,
            status: Status::True,
            reason: "FilesystemFrozen",
            message: "the node agent froze the volume's filesystem while it was copied: one instant of the running application, as after a power cut".into(),
        },
        Capture::Tool => Desired {
            type_: CONSISTENT,
            status: Status::True,
            reason: "ApplicationTool",
            message: "the application's own backup tool wrote the copy while it ran".into(),
        },
        Capture::Hooks => Desired {
            type_: CONSISTENT,
            status: Status::True,
            reason: "ApplicationHooks",
            message: "copied after the application's pre hook ran in its pod: as consistent as that hook makes its files".into(),
        },
        Capture::CrashUnsafe => Desired {
            type_: CONSISTENT,
            status: Status::False,
            reason: "CrashUnsafeCopy",
            message: "copied while a running pod mounted the claim (spec.consistency.method CrashUnsafe): the copy is no point in time; the application may not start from it".into(),
        },
    }
}

/// Why a `Stopped` copy that just finished is not a copy of a stopped application: a pod
/// that mounts the claim ran during it (`started` names it). `None` when none did.
pub fn started_during(capture: Option<Capture>, started: Option<&str>) -> Option<String> {
    match (capture, started) {
        (Some(Capture::Stopped), Some(pod)) => Some(format!(
            "pod {pod} started and mounted the claim while it was copied as a stopped application; the copy may hold its writes half done. Back up again while the application is stopped, or choose spec.consistency"
        )),
        _ => None,
    }
}

/// How a started copy runs, carried once instead of read again from the recorded capture
/// and the chosen method at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CopyMethod<'a> {
    /// Nothing around the copy: a stopped application, a crash-unsafe copy, a command.
    Plain,
    /// Every filesystem frozen before the first read, for at most `max_seconds`.
    Frozen { max_seconds: u32 },
    /// Between the application's hooks.
    Hooks(&'a Hooks),
    /// By the application's tool.
    Tool(&'a BackupTool),
}

/// Refused: the copy was to run between hooks, and none are named now.
pub const HOOKS_MISSING: &str = "HooksMissing";
/// Refused: the copy was to be made by a tool, and none is named now.
pub const TOOL_MISSING: &str = "ToolMissing";

/// The method of a copy that recorded `capture` (and, frozen, `recorded_max_seconds`), with
/// `chosen` the method the Backup or its Cluster names now; why it cannot run, if the method
/// it was started with is no longer named.
pub fn copy_method<'a>(
    capture: Option<Capture>,
    recorded_max_seconds: Option<i32>,
    chosen: Option<&'a Consistency>,
) -> Result<CopyMethod<'a>, (&'static str, String)> {
    match capture {
        Some(Capture::Frozen) => Ok(CopyMethod::Frozen {
            max_seconds: recorded_max_seconds
                .and_then(|seconds| u32::try_from(seconds).ok())
                .unwrap_or_else(|| max_freeze_seconds(chosen)),
        }),
        Some(Capture::Hooks) => chosen
            .and_then(|chosen| chosen.hooks.as_ref())
            .map(CopyMethod::Hooks)
            .ok_or((
                HOOKS_MISSING,
                "the copy was to run between the application's hooks, and spec.consistency no longer names them (on the Backup or its Cluster); create a new Backup".into(),
            )),
        Some(Capture::Tool) => chosen
            .and_then(|chosen| chosen.tool.as_ref())
            .map(CopyMethod::Tool)
            .ok_or((
                TOOL_MISSING,
                "the copy was to be made by the application's tool, and spec.consistency no longer names one (on the Backup or its Cluster); create a new Backup".into(),
            )),
        Some(Capture::Stopped | Capture::CrashUnsafe) | None => Ok(CopyMethod::Plain),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounter() -> Mounter {
        Mounter {
            pod: "db-0".into(),
            node: "node-a".into(),
            ip: Some("10.0.0.7".into()),
            stateful_set: Some("db".into()),
        }
    }

    #[test]
    fn a_volume_is_copied_only_when_stopped_or_by_a_chosen_method() {
        let rows: [(Option<ConsistencyMethod>, Option<Mounter>, Decision); 9] = [
            // Stopped: no method needed; the scheduler places the Job where the claim is.
            (
                None,
                None,
                Decision::Copy {
                    capture: Capture::Stopped,
                    node: None,
                },
            ),
            (
                Some(ConsistencyMethod::CrashUnsafe),
                None,
                Decision::Copy {
                    capture: Capture::Stopped,
                    node: None,
                },
            ),
            // Stopped: nothing to freeze.
            (
                Some(ConsistencyMethod::Freeze),
                None,
                Decision::Copy {
                    capture: Capture::Stopped,
                    node: None,
                },
            ),
            // Running with Freeze: frozen where it runs.
            (
                Some(ConsistencyMethod::Freeze),
                Some(mounter()),
                Decision::Copy {
                    capture: Capture::Frozen,
                    node: Some("node-a".into()),
                },
            ),
            // Stopped: no tool can reach it; the volume is what it left.
            (
                Some(ConsistencyMethod::Tool),
                None,
                Decision::Copy {
                    capture: Capture::Stopped,
                    node: None,
                },
            ),
            // Running with Tool: the tool runs where the application runs.
            (
                Some(ConsistencyMethod::Tool),
                Some(mounter()),
                Decision::Copy {
                    capture: Capture::Tool,
                    node: Some("node-a".into()),
                },
            ),
            // Running with Hooks: copied where it runs, between its hooks.
            (
                Some(ConsistencyMethod::Hooks),
                Some(mounter()),
                Decision::Copy {
                    capture: Capture::Hooks,
                    node: Some("node-a".into()),
                },
            ),
            // Running with CrashUnsafe: copied where it runs, and said so.
            (
                Some(ConsistencyMethod::CrashUnsafe),
                Some(mounter()),
                Decision::Copy {
                    capture: Capture::CrashUnsafe,
                    node: Some("node-a".into()),
                },
            ),
            // Running, no method: refused.
            (None, Some(mounter()), Decision::Refuse(String::new())),
        ];
        for (method, mounter, want) in rows {
            let got = decide(method, mounter.as_ref(), "data-db-0", "orders", "db");
            match (&got, &want) {
                (Decision::Refuse(message), Decision::Refuse(_)) => {
                    for part in [
                        "db-0",
                        "node-a",
                        "data-db-0",
                        "scale StatefulSet db to 0",
                        "Cluster orders",
                        "Freeze",
                        "Tool",
                        "Hooks",
                        "CrashUnsafe",
                    ] {
                        assert!(message.contains(part), "{part} in {message}");
                    }
                }
                _ => assert_eq!(got, want, "{method:?} {mounter:?}"),
            }
        }
    }

    #[test]
    fn the_backup_method_wins_over_the_clusters() {
        let unsafe_copy = Consistency {
            method: ConsistencyMethod::CrashUnsafe,
            max_freeze_seconds: None,
            tool: None,
            hooks: None,
        };
        let freeze = Consistency {
            method: ConsistencyMethod::Freeze,
            max_freeze_seconds: Some(20),
            tool: None,
            hooks: None,
        };
        assert_eq!(method(chosen(None, None)), None);
        assert_eq!(
            method(chosen(Some(&unsafe_copy), None)),
            Some(ConsistencyMethod::CrashUnsafe)
        );
        assert_eq!(
            method(chosen(None, Some(&unsafe_copy))),
            Some(ConsistencyMethod::CrashUnsafe)
        );
        assert_eq!(
            method(chosen(Some(&freeze), Some(&unsafe_copy))),
            Some(ConsistencyMethod::Freeze)
        );
        assert_eq!(
            method(chosen(Some(&unsafe_copy), Some(&freeze))),
            Some(ConsistencyMethod::CrashUnsafe)
        );
    }

    #[test]
    fn a_freeze_is_bounded_by_the_chosen_seconds_or_a_minute() {
        let freeze = |seconds| Consistency {
            method: ConsistencyMethod::Freeze,
            max_freeze_seconds: seconds,
            tool: None,
            hooks: None,
        };
        assert_eq!(max_freeze_seconds(None), 60);
        assert_eq!(max_freeze_seconds(Some(&freeze(None))), 60);
        assert_eq!(max_freeze_seconds(Some(&freeze(Some(20)))), 20);
        assert_eq!(max_freeze_seconds(Some(&freeze(Some(0)))), 60);
        assert_eq!(max_freeze_seconds(Some(&freeze(Some(-5)))), 60);
    }

    #[test]
    fn the_condition_says_whether_the_copy_is_a_point_in_time() {
        assert_eq!(condition(Capture::Stopped).status, Status::True);
        assert_eq!(condition(Capture::Frozen).status, Status::True);
        assert_eq!(condition(Capture::Frozen).reason, "FilesystemFrozen");
        assert_eq!(condition(Capture::Stopped).reason, "ApplicationStopped");
        assert_eq!(condition(Capture::Tool).status, Status::True);
        assert_eq!(condition(Capture::Tool).reason, "ApplicationTool");
        assert_eq!(condition(Capture::Hooks).status, Status::True);
        assert_eq!(condition(Capture::Hooks).reason, "ApplicationHooks");
        assert_eq!(condition(Capture::CrashUnsafe).status, Status::False);
        assert_eq!(condition(Capture::CrashUnsafe).reason, "CrashUnsafeCopy");
    }

    #[test]
    fn a_pod_that_started_during_a_stopped_copy_fails_it() {
        assert_eq!(started_during(Some(Capture::Stopped), None), None);
        assert_eq!(
            started_during(Some(Capture::CrashUnsafe), Some("db-0")),
            None
        );
        assert_eq!(started_during(None, Some("db-0")), None);
        let message = started_during(Some(Capture::Stopped), Some("db-0")).unwrap();
        assert!(message.contains("pod db-0"), "{message}");
    }

    #[test]
    fn a_started_copy_runs_by_the_method_it_recorded_or_not_at_all() {
        let named: Consistency = serde_json::from_value(serde_json::json!({
            "method": "Tool", "maxFreezeSeconds": 30,
            "tool": {"image": "i", "command": ["c"]},
            "hooks": {"pre": {"container": "db", "command": ["p"]}},
        }))
        .unwrap();
        let bare: Consistency =
            serde_json::from_value(serde_json::json!({"method": "Freeze"})).unwrap();
        let tool = named.tool.as_ref().unwrap();
        let hooks = named.hooks.as_ref().unwrap();
        // (capture, recorded bound, chosen) -> method, or the reason it cannot run
        type Row<'a> = (
            Option<Capture>,
            Option<i32>,
            Option<&'a Consistency>,
            Result<CopyMethod<'a>, &'static str>,
        );
        let rows: Vec<Row<'_>> = vec![
            (None, None, None, Ok(CopyMethod::Plain)),
            (
                Some(Capture::Stopped),
                None,
                Some(&named),
                Ok(CopyMethod::Plain),
            ),
            (
                Some(Capture::CrashUnsafe),
                None,
                Some(&named),
                Ok(CopyMethod::Plain),
            ),
            (
                Some(Capture::Frozen),
                Some(45),
                Some(&named),
                Ok(CopyMethod::Frozen { max_seconds: 45 }),
            ),
            (
                Some(Capture::Frozen),
                None,
                Some(&named),
                Ok(CopyMethod::Frozen { max_seconds: 30 }),
            ),
            (
                Some(Capture::Frozen),
                None,
                None,
                Ok(CopyMethod::Frozen {
                    max_seconds: DEFAULT_MAX_FREEZE_SECONDS,
                }),
            ),
            (
                Some(Capture::Frozen),
                Some(-1),
                Some(&bare),
                Ok(CopyMethod::Frozen {
                    max_seconds: DEFAULT_MAX_FREEZE_SECONDS,
                }),
            ),
            (
                Some(Capture::Hooks),
                None,
                Some(&named),
                Ok(CopyMethod::Hooks(hooks)),
            ),
            (Some(Capture::Hooks), None, Some(&bare), Err(HOOKS_MISSING)),
            (Some(Capture::Hooks), None, None, Err(HOOKS_MISSING)),
            (
                Some(Capture::Tool),
                None,
                Some(&named),
                Ok(CopyMethod::Tool(tool)),
            ),
            (Some(Capture::Tool), None, Some(&bare), Err(TOOL_MISSING)),
        ];
        for (capture, recorded, chosen, expected) in rows {
            let found = copy_method(capture, recorded, chosen).map_err(|(reason, message)| {
                assert!(message.contains("create a new Backup"), "{message}");
                reason
            });
            assert_eq!(found, expected, "{capture:?} {recorded:?}");
        }
    }
}
