use std::time::Duration;

use rustic_core::Id;
use rustic_core::repofile::{BlobType, IndexFile, IndexPack, PackId};

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn the_deadline_leaves_room_for_two_clocks_and_a_slow_plan() {
    assert_eq!(
        COMMIT_DEADLINE + CLOCK_ALLOWANCE + PLANNING_LIMIT,
        DELETE_GRACE
    );
    type Case = (Duration, bool);
    let cases: &[Case] = &[
        (Duration::ZERO, true),
        (COMMIT_DEADLINE - MINUTE, true),
        (COMMIT_DEADLINE - Duration::from_nanos(1), true),
        (COMMIT_DEADLINE, false),
        (COMMIT_DEADLINE + MINUTE, false),
        (DELETE_GRACE, false),
    ];
    for &(elapsed, allowed) in cases {
        assert_eq!(may_commit(elapsed).is_ok(), allowed, "{elapsed:?}");
    }
    assert_eq!(
        may_commit(COMMIT_DEADLINE + MINUTE),
        Err(Refused::TooLate {
            elapsed_minutes: 21 * 60 + 1,
            deadline_minutes: 21 * 60
        })
    );
}

#[test]
fn a_plan_is_acted_on_only_while_it_is_fresh() {
    type Case = (Duration, bool);
    let cases: &[Case] = &[
        (Duration::ZERO, true),
        (PLANNING_LIMIT - MINUTE, true),
        (PLANNING_LIMIT, false),
        (2 * PLANNING_LIMIT, false),
    ];
    for &(planning, allowed) in cases {
        assert_eq!(may_execute(planning).is_ok(), allowed, "{planning:?}");
    }
}

#[test]
fn prunes_never_delete_at_once_and_wait_the_grace() {
    let options = options();
    assert!(!options.instant_delete);
    assert!(!options.early_delete_index);
    assert_eq!(
        options
            .keep_delete
            .total(rustic_core::jiff::Unit::Second)
            .unwrap(),
        DELETE_GRACE.as_secs_f64()
    );
}

fn id(n: u8) -> Id {
    Id::new([n; 32])
}

/// A pack as an index file names it (built from restic's JSON: rustic_core does not export
/// the location type).
fn pack(n: u8, blobs: &[(BlobType, u8)]) -> IndexPack {
    let blobs: Vec<serde_json::Value> = blobs
        .iter()
        .map(|&(kind, blob)| {
            serde_json::json!({
                "id": id(blob).to_hex().to_string(),
                "type": kind,
                "offset": 0,
                "length": 1,
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "id": id(100 + n).to_hex().to_string(),
        "blobs": blobs,
    }))
    .expect("an index pack")
}

fn index(listed: Vec<IndexPack>, marked: Vec<IndexPack>) -> IndexFile {
    IndexFile {
        packs: listed,
        packs_to_delete: marked,
        ..IndexFile::default()
    }
}

#[test]
fn reused_blocks_in_marked_packs_are_listed_again_and_vanished_ones_named() {
    const D: BlobType = BlobType::Data;
    const T: BlobType = BlobType::Tree;
    let reused = |blocks: &[(BlobType, u8)]| -> Referenced {
        blocks.iter().map(|&(kind, n)| (kind, id(n))).collect()
    };
    type Case = (
        &'static str,
        Vec<IndexFile>,
        Referenced,
        Vec<u8>,
        Vec<(BlobType, u8)>,
    );
    let cases: Vec<Case> = vec![
        (
            "all listed: nothing to do",
            vec![index(vec![pack(1, &[(D, 1), (D, 2)])], vec![])],
            reused(&[(D, 1), (D, 2)]),
            vec![],
            vec![],
        ),
        (
            "only in a marked pack: that pack listed again",
            vec![index(vec![], vec![pack(1, &[(D, 1), (D, 2)])])],
            reused(&[(D, 1)]),
            vec![1],
            vec![],
        ),
        (
            "listed in one pack, marked in another: the listed one is enough",
            vec![
                index(vec![], vec![pack(1, &[(D, 1)])]),
                index(vec![pack(2, &[(D, 1)])], vec![]),
            ],
            reused(&[(D, 1)]),
            vec![],
            vec![],
        ),
        (
            "two blocks in the same marked pack: listed again once",
            vec![index(vec![], vec![pack(1, &[(D, 1), (D, 2)])])],
            reused(&[(D, 1), (D, 2)]),
            vec![1],
            vec![],
        ),
        (
            "nowhere: missing",
            vec![index(vec![pack(1, &[(D, 1)])], vec![])],
            reused(&[(D, 1), (D, 3)]),
            vec![],
            vec![(D, 3)],
        ),
        (
            "a tree and data with the same ID are different blocks",
            vec![index(vec![pack(1, &[(D, 1)])], vec![pack(2, &[(T, 1)])])],
            reused(&[(D, 1), (T, 1)]),
            vec![2],
            vec![],
        ),
        (
            "a data block of that ID does not stand for the tree",
            vec![index(vec![pack(1, &[(D, 1)])], vec![])],
            reused(&[(T, 1)]),
            vec![],
            vec![(T, 1)],
        ),
        (
            "several missing and several to list again: each in order, whatever the set's",
            vec![index(
                vec![],
                vec![pack(9, &[(D, 9)]), pack(2, &[(D, 2)]), pack(5, &[(T, 5)])],
            )],
            reused(&[(D, 9), (D, 8), (T, 5), (D, 2), (D, 4), (T, 1)]),
            // Trees before data, each by ID.
            vec![5, 2, 9],
            vec![(T, 1), (D, 4), (D, 8)],
        ),
        (
            "nothing reused: nothing to do",
            vec![index(vec![], vec![pack(1, &[(D, 1)])])],
            Referenced::default(),
            vec![],
            vec![],
        ),
    ];
    for (name, indexes, reused, relist, missing) in cases {
        let found = recovery(&reused, &indexes);
        let relisted: Vec<PackId> = found.relist.iter().map(|pack| pack.id).collect();
        let wanted: Vec<PackId> = relist.iter().map(|&n| PackId::from(id(100 + n))).collect();
        assert_eq!(relisted, wanted, "{name}");
        let wanted: Vec<(BlobType, Id)> = missing.iter().map(|&(kind, n)| (kind, id(n))).collect();
        assert_eq!(found.missing, wanted, "{name}");
        // A pack listed again keeps its blocks (the index must still locate them).
        for pack in &found.relist {
            assert!(!pack.blobs.is_empty(), "{name}");
        }
    }
}

#[test]
fn the_loaded_index_stands_only_while_every_file_it_came_from_is_listed() {
    let now = |ids: &[u8]| ids.iter().map(|&n| id(n)).collect::<HashSet<Id>>();
    let loaded = |ids: &[u8]| ids.iter().map(|&n| id(n)).collect::<Vec<Id>>();
    // (loaded, listed now, stands)
    let cases: [(&[u8], &[u8], bool); 7] = [
        (&[], &[], true),
        // Files written since (this backup's, another's, a prune's) change nothing loaded.
        (&[1, 2], &[1, 2], true),
        (&[1, 2], &[1, 2, 3], true),
        (&[], &[3], true),
        // A loaded file removed (a prune rewrote it): its packs may be marked now.
        (&[1, 2], &[1], false),
        (&[1, 2], &[2, 3], false),
        (&[1], &[], false),
    ];
    for (was, is, stands) in cases {
        assert_eq!(
            loaded_still_listed(&loaded(was), &now(is)),
            stands,
            "loaded {was:?}, listed {is:?}"
        );
    }
}
