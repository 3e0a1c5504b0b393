use std::sync::Arc;

use bytes::Bytes;
use rustic_core::repofile::{BlobType, MasterKey};

use super::*;
use crate::memory::MemoryBackend;
use crate::test_bytes;

const MIB: usize = 1 << 20;

fn writer(sealing_bytes: usize) -> Writer {
    Writer::new(
        Arc::new(MemoryBackend::new()),
        Cipher::new(&MasterKey::new()).expect("a cipher"),
        WriterOptions {
            sealing_bytes,
            data_pack_bytes: 4 * MIB,
            ..WriterOptions::default()
        },
    )
}

fn store(writer: &mut Writer, block: Vec<u8>) {
    writer
        .store(BlobType::Data, block_id(&block), Bytes::from(block), false)
        .expect("stored");
}

#[test]
fn blocks_wait_for_room_among_those_being_sealed_and_a_larger_one_goes_alone() {
    // Handed over far faster than two threads seal them: without the bound all would wait at
    // once.
    let blocks: Vec<Vec<u8>> = (0..40).map(|seed| test_bytes(MIB, seed)).collect();
    let mut bounded = writer(3 * MIB);
    for block in blocks {
        store(&mut bounded, block);
    }
    let stats = bounded.finish().expect("finished");
    assert_eq!(stats.data_blocks_new, 40);
    assert!(
        (MIB as u64..=3 * MIB as u64).contains(&stats.peak_sealing_bytes),
        "{stats:?}"
    );

    // A block larger than the bound waits until nothing else is being sealed, then goes alone.
    let mut alone = writer(3 * MIB);
    store(&mut alone, test_bytes(MIB, 100));
    store(&mut alone, test_bytes(5 * MIB, 101));
    store(&mut alone, test_bytes(MIB, 102));
    let stats = alone.finish().expect("finished");
    assert_eq!(stats.data_blocks_new, 3);
    assert_eq!(stats.peak_sealing_bytes, 5 * MIB as u64, "{stats:?}");
}

#[test]
fn a_block_that_would_start_another_pack_waits_while_enough_packs_are_not_yet_stored() {
    // 12 blocks of 256 KiB, two to a pack: 6 packs, each taking 800 ms to store, sealed far
    // faster (even by a debug build on a loaded machine: 200 ms was not always enough for two
    // packs). Without the bound, full packs would pile up for the uploader.
    const BLOCK: usize = 256 << 10;
    let blocks: Vec<Vec<u8>> = (0..12).map(|seed| test_bytes(BLOCK, seed)).collect();
    for unstored in [1, 3] {
        let mut writer = Writer::new(
            Arc::new(MemoryBackend::with_pack_delay(
                std::time::Duration::from_millis(800),
            )),
            Cipher::new(&MasterKey::new()).expect("a cipher"),
            WriterOptions {
                data_pack_bytes: 2 * BLOCK + BLOCK / 2,
                packs_unstored: unstored,
                uploads: 1,
                ..WriterOptions::default()
            },
        );
        for block in &blocks {
            store(&mut writer, block.clone());
        }
        let stats = writer.finish().expect("finished");
        assert_eq!((stats.data_blocks_new, stats.packs), (12, 6), "{stats:?}");
        assert_eq!(stats.peak_packs_unstored, unstored as u64, "{stats:?}");
    }
}
