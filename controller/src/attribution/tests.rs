use super::*;

const T: Nanos = 1_796_000_000 * SECOND; // 2026-11-30T00:53:20Z
const MS: Nanos = 1_000_000;

fn stamp(nanos: Nanos) -> String {
    Timestamp::from_nanosecond(i128::from(nanos))
        .unwrap()
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string()
}

fn dump(name_at: Nanos, modified_at: Nanos) -> Candidate {
    Candidate {
        key: format!("dumps/db-{}.sql.gz", stamp(name_at)),
        last_modified: modified_at,
    }
}

fn run(offset: Option<Nanos>) -> Run {
    Run {
        start: T,
        end: T + 20 * SECOND,
        offset: offset.map(|offset| Offset {
            offset,
            round_trip: MS,
        }),
    }
}

#[test]
fn names_carry_times() {
    assert_eq!(name_time("db-20261130T005320Z.sql"), Some(T));
    assert_eq!(name_time("db-2026-11-30T00:53:20Z.sql"), Some(T));
    assert_eq!(
        name_time("db-2026-11-30T00:53:20Z-20261130T005321Z"),
        Some(T + SECOND),
        "the last wins"
    );
    assert_eq!(name_time("db-latest.sql"), None);
    assert_eq!(name_time("db-20261330T005320Z.sql"), None, "month 13");
    assert_eq!(name_time("20261130T0053Z"), None, "too short");
    // Every separator counts, in both forms.
    for wrong in [
        "db-20261130T005320X",
        "db-20261130X005320Z",
        "db-2026-11-30T00:53:20X",
        "db-2026_11-30T00:53:20Z",
        "db-2026-11_30T00:53:20Z",
        "db-2026-11-30X00:53:20Z",
        "db-2026-11-30T00_53:20Z",
        "db-2026-11-30T00:53_20Z",
    ] {
        assert_eq!(name_time(wrong), None, "{wrong}");
    }
}

#[test]
fn a_refusal_names_the_window() {
    let refusal = attribute(&run(Some(0)), &[dump(T + 100 * SECOND, T)], &[]).unwrap_err();
    assert_eq!(refusal.reason, "NoDumpInWindow");
    assert!(
        refusal.message.contains("2026-11-30T00:53:18.9995Z")
            && refusal.message.contains("2026-11-30T00:53:41.0005Z"),
        "{}",
        refusal.message
    );
}

#[test]
fn attribution_decisions() {
    let s = SECOND;
    let other = |name: &str, start: Nanos, end: Option<Nanos>, key: Option<&str>| OtherRun {
        name: name.into(),
        start,
        end,
        key: key.map(str::to_string),
        offset: Some(Offset {
            offset: 0,
            round_trip: MS,
        }),
    };
    // Another run on a node whose clock was `offset` ahead.
    let skewed = |name: &str, start: Nanos, end: Nanos, offset: Nanos| OtherRun {
        name: name.into(),
        start,
        end: Some(end),
        key: None,
        offset: Some(Offset {
            offset,
            round_trip: MS,
        }),
    };
    // This run, measured with a 4 s round trip: the window widens by 3 s.
    let slow = || Run {
        offset: Some(Offset {
            offset: 0,
            round_trip: 4 * s,
        }),
        ..run(Some(0))
    };
    let ours = dump(T + 5 * s, T + 6 * s);
    let yesterday = dump(T - 86_400 * s, T - 86_399 * s);
    type Row = (
        &'static str,
        Run,
        Vec<Candidate>,
        Vec<OtherRun>,
        Result<Nanos, &'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            "one dump in the run",
            run(Some(0)),
            vec![ours.clone()],
            vec![],
            Ok(T + 5 * s),
        ),
        (
            "an old dump beside it",
            run(Some(0)),
            vec![yesterday.clone(), ours.clone()],
            vec![],
            Ok(T + 5 * s),
        ),
        (
            "node 30 s ahead, measured",
            run(Some(30 * s)),
            vec![dump(T + 35 * s, T + 6 * s)],
            vec![],
            Ok(T + 5 * s),
        ),
        (
            "node 30 s behind, measured",
            run(Some(-30 * s)),
            vec![dump(T - 25 * s, T + 6 * s)],
            vec![],
            Ok(T + 5 * s),
        ),
        (
            "node 30 s ahead, not measured",
            run(None),
            vec![dump(T + 35 * s, T + 6 * s)],
            vec![],
            Err("NoClockOffset"),
        ),
        (
            "node 30 s ahead, offset taken as 0",
            run(Some(0)),
            vec![dump(T + 35 * s, T + 6 * s)],
            vec![],
            Err("NoDumpInWindow"),
        ),
        (
            "name in the run, written much later",
            run(Some(0)),
            vec![dump(T + 5 * s, T + 100 * s)],
            vec![],
            Err("NoDumpInWindow"),
        ),
        (
            "no time in the name",
            run(Some(0)),
            vec![Candidate {
                key: "dumps/latest.sql".into(),
                last_modified: T + 6 * s,
            }],
            vec![],
            Err("NoDumpInWindow"),
        ),
        (
            "two dumps in the run",
            run(Some(0)),
            vec![ours.clone(), dump(T + 9 * s, T + 10 * s)],
            vec![],
            Err("AmbiguousDump"),
        ),
        (
            "another run at the same time",
            run(Some(0)),
            vec![ours.clone()],
            vec![other("b", T + 3 * s, Some(T + 10 * s), None)],
            Err("OverlappingRun"),
        ),
        (
            "another run still going",
            run(Some(0)),
            vec![ours.clone()],
            vec![other("b", T - 10 * s, None, None)],
            Err("OverlappingRun"),
        ),
        (
            "another run long before",
            run(Some(0)),
            vec![ours.clone()],
            vec![other("b", T - 100 * s, Some(T - 50 * s), Some("dumps/old"))],
            Ok(T + 5 * s),
        ),
        (
            "already recorded by another",
            run(Some(0)),
            vec![ours.clone()],
            vec![other(
                "b",
                T - 100 * s,
                Some(T - 50 * s),
                Some(ours.key.as_str()),
            )],
            Err("DumpClaimedByAnother"),
        ),
        (
            "the window edge: name a second before start",
            run(Some(0)),
            vec![dump(T - s, T + s)],
            vec![],
            Ok(T - s),
        ),
        (
            "LastModified the server tolerance before the start",
            run(Some(0)),
            vec![dump(T + s, T - 2 * s)],
            vec![],
            Ok(T + s),
        ),
        (
            "LastModified just beyond the server tolerance",
            run(Some(0)),
            vec![dump(T + s, T - 2 * s - 1)],
            vec![],
            Err("NoDumpInWindow"),
        ),
        (
            "LastModified after the end, within the tolerance",
            run(Some(0)),
            vec![dump(T + 19 * s, T + 22 * s)],
            vec![],
            Ok(T + 19 * s),
        ),
        (
            "name a second after the end",
            run(Some(0)),
            vec![dump(T + 21 * s, T + 21 * s)],
            vec![],
            Ok(T + 21 * s),
        ),
        (
            "a slow round trip widens by half of it",
            slow(),
            vec![dump(T - 3 * s, T + s)],
            vec![],
            Ok(T - 3 * s),
        ),
        (
            "and no further",
            slow(),
            vec![dump(T - 4 * s, T + s)],
            vec![],
            Err("NoDumpInWindow"),
        ),
        (
            "another run's node, 30 s ahead, named it in that run",
            run(Some(0)),
            vec![ours.clone()],
            vec![skewed("b", T - 40 * s, T - 20 * s, 30 * s)],
            Err("OverlappingRun"),
        ),
        (
            "another run wrote it by LastModified only: it started just before",
            run(Some(0)),
            vec![ours.clone()],
            vec![skewed("b", T + 5 * s, T + 15 * s, 100 * s)],
            Err("OverlappingRun"),
        ),
        (
            "another run wrote it by LastModified only: it ended just before",
            run(Some(0)),
            vec![ours.clone()],
            vec![skewed("b", T - 10 * s, T + 5 * s, 100 * s)],
            Err("OverlappingRun"),
        ),
        (
            "another run started after the dump was written",
            run(Some(0)),
            vec![ours.clone()],
            vec![skewed("b", T + 10 * s, T + 15 * s, 100 * s)],
            Ok(T + 5 * s),
        ),
        (
            "beyond the edge",
            run(Some(0)),
            vec![dump(T - 3 * s, T + s)],
            vec![],
            Err("NoDumpInWindow"),
        ),
    ];
    for (name, run, candidates, others, expected) in rows {
        match (attribute(&run, &candidates, &others), expected) {
            (Ok(found), Ok(corrected)) => assert_eq!(found.corrected, corrected, "{name}"),
            (Err(refusal), Err(reason)) => {
                assert_eq!(refusal.reason, reason, "{name}: {}", refusal.message)
            }
            (outcome, expected) => panic!("{name}: got {outcome:?}, expected {expected:?}"),
        }
    }
}
