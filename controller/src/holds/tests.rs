use super::*;

fn run(name: &str, started: bool, terminal: bool) -> Run<'_> {
    Run {
        name,
        started,
        terminal,
    }
}

#[test]
fn a_backup_waits_for_any_restore_that_is_not_over() {
    let rows: &[(&str, Vec<Run>, bool)] = &[
        ("no restore", vec![], false),
        ("restore not started", vec![run("r", false, false)], true),
        ("restore running", vec![run("r", true, false)], true),
        ("restore over", vec![run("r", true, true)], false),
        (
            "one over, one running",
            vec![run("a", true, true), run("b", true, false)],
            true,
        ),
    ];
    for (name, restores, waits) in rows {
        let hold = backup_hold("db", restores);
        assert_eq!(
            matches!(hold, Hold::Wait { .. }),
            *waits,
            "{name}: {hold:?}"
        );
        if let Hold::Wait { reason, message } = hold {
            assert_eq!(reason, RESTORE_IN_PROGRESS);
            assert!(message.contains("Restore "), "{message}");
        }
    }
}

#[test]
fn a_restore_waits_only_for_a_running_backup() {
    let rows: &[(&str, Vec<Run>, bool)] = &[
        ("no backup", vec![], false),
        (
            "backup not started: it yields",
            vec![run("b", false, false)],
            false,
        ),
        ("backup running", vec![run("b", true, false)], true),
        ("backup over", vec![run("b", true, true)], false),
    ];
    for (name, backups, waits) in rows {
        let hold = restore_hold("db", backups);
        assert_eq!(
            matches!(hold, Hold::Wait { .. }),
            *waits,
            "{name}: {hold:?}"
        );
        if let Hold::Wait { reason, .. } = hold {
            assert_eq!(reason, BACKUP_IN_PROGRESS);
        }
    }
}

#[test]
fn one_claim_at_a_time() {
    let me = holder("Backup", "u1");
    assert_eq!(claim(None, &me, false), Claim::Create);
    assert_eq!(claim(Some(&me), &me, true), Claim::Held);
    assert_eq!(claim(Some("Restore/u2"), &me, false), Claim::TakeOver);
    assert_eq!(
        claim(Some("Restore/u2"), &me, true),
        Claim::Wait {
            holder: "Restore/u2".into()
        }
    );
    assert_eq!(lease_name("abc"), "custody-run-abc");
    assert_eq!(holder("Backup", "u1"), "Backup/u1");
    assert_ne!(holder("Backup", "u1"), holder("Restore", "u1"));
}
