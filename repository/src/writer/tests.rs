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

/// Sets its flag when dropped.
struct Dropped(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn hold() -> (Arc<std::sync::atomic::AtomicBool>, Option<Hold>) {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    (flag.clone(), Some(Box::new(Dropped(flag))))
}

/// Hands `block` over with a hold; the flag is set once the writer drops it.
fn store_held(
    writer: &mut Writer,
    block: &[u8],
    known: bool,
) -> Arc<std::sync::atomic::AtomicBool> {
    let (dropped, held) = hold();
    writer
        .store_holding(
            BlobType::Data,
            block_id(block),
            Bytes::copy_from_slice(block),
            known,
            held,
        )
        .expect("handed over");
    dropped
}

/// Whether `flag` is set within `within`.
fn set_within(flag: &std::sync::atomic::AtomicBool, within: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < within {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    flag.load(std::sync::atomic::Ordering::SeqCst)
}

/// A writer on `backend` with one pack of one and a half `block`s unstored at a time and one
/// upload: a block that starts the next pack waits, sealed, for the previous one's upload.
fn one_pack_at_a_time(backend: MemoryBackend, block: usize) -> Writer {
    Writer::new(
        Arc::new(backend),
        Cipher::new(&MasterKey::new()).expect("a cipher"),
        WriterOptions {
            data_pack_bytes: block + block / 2,
            packs_unstored: 1,
            uploads: 1,
            ..WriterOptions::default()
        },
    )
}

#[test]
fn a_blocks_hold_is_dropped_when_the_writer_lets_its_bytes_go() {
    use std::time::Duration;
    const BLOCK: usize = 256 << 10;
    // One pack at a time, each taking 800 ms to store: a block that starts the next pack
    // waits that long, sealed, in its own buffer when it does not compress.
    let mut writer = one_pack_at_a_time(
        MemoryBackend::with_pack_delay(Duration::from_millis(800)),
        BLOCK,
    );
    let first = test_bytes(2 * BLOCK, 1);
    let first_dropped = store_held(&mut writer, &first, false);
    // Its pack is full: the next pack waits for it to be stored.
    assert!(
        set_within(&first_dropped, Duration::from_secs(5)),
        "in a pack, let go"
    );
    let waiting = test_bytes(BLOCK, 2);
    let waiting_dropped = store_held(&mut writer, &waiting, false);
    // A block that compresses lets go once compressed, though it waits behind that one.
    let text = b"committed ".repeat(BLOCK / 10);
    let text_dropped = store_held(&mut writer, &text, false);
    assert!(
        set_within(&text_dropped, Duration::from_millis(300)),
        "compressed, let go"
    );
    assert!(
        !waiting_dropped.load(std::sync::atomic::Ordering::SeqCst),
        "an incompressible block waiting for its pack keeps its hold"
    );
    assert!(
        set_within(&waiting_dropped, Duration::from_secs(5)),
        "then lets it go"
    );

    // A block not stored (stored already in this run, or known) lets go at once.
    for known in [false, true] {
        let dropped = store_held(&mut writer, &waiting, known);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
    }
    let stats = writer.finish().expect("finished");
    assert_eq!(stats.data_blocks_new, 3, "{stats:?}");
}

#[test]
fn a_failed_writer_drops_the_holds_of_blocks_waiting_for_their_turn() {
    use std::time::Duration;
    const BLOCK: usize = 256 << 10;
    // The first block fills a pack, whose upload fails after 500 ms; the second waits, sealed,
    // for room for another pack meanwhile. It is never stored: its hold goes with the failure,
    // not when the writer is dropped (a reader waiting for its room would wait for ever).
    let mut writer = one_pack_at_a_time(
        MemoryBackend::refusing_packs_after(Duration::from_millis(500)),
        BLOCK,
    );
    let first = test_bytes(2 * BLOCK, 1);
    writer
        .store(BlobType::Data, block_id(&first), Bytes::from(first), false)
        .expect("handed over");
    let waiting = test_bytes(BLOCK, 2);
    let dropped = store_held(&mut writer, &waiting, false);
    assert!(
        !set_within(&dropped, Duration::from_millis(200)),
        "held while it waits for its pack"
    );
    assert!(
        set_within(&dropped, Duration::from_secs(5)),
        "let go once the writer failed"
    );
    assert!(writer.finish().is_err());
}

/// Every block `backend` holds, opened through the index files: (ID, plaintext).
fn blocks_read_back(backend: &MemoryBackend, cipher: &Cipher) -> Vec<(String, Vec<u8>)> {
    use rustic_core::ReadBackend;
    let mut blocks = Vec::new();
    let mut decompressor = zstd::bulk::Decompressor::new().expect("zstd");
    for index in backend.ids(FileType::Index) {
        let sealed = backend
            .read_full(FileType::Index, &index)
            .expect("an index");
        let plain = cipher.open(&sealed).expect("the index opens");
        assert_eq!(plain[0], 2, "repository format 2 compresses its files");
        let json = zstd::bulk::decompress(&plain[1..], 1 << 24).expect("decompresses");
        let index: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        for pack in index["packs"].as_array().expect("packs") {
            let pack_id: Id = pack["id"].as_str().unwrap().parse().expect("an ID");
            // As restic reads a pack: its blocks one after another from its start, then its
            // sealed header (an entry of 37 or 41 bytes a block), then the header's length.
            let whole = backend
                .read_full(FileType::Pack, &pack_id)
                .expect("the pack");
            let header_length =
                u32::from_le_bytes(whole[whole.len() - 4..].try_into().unwrap()) as usize;
            let header_at = whole.len() - 4 - header_length;
            let header = cipher
                .open(&whole[header_at..whole.len() - 4])
                .expect("the header opens");
            let blobs = pack["blobs"].as_array().expect("blobs");
            let mut entries = Vec::new();
            let mut rest = &header[..];
            while !rest.is_empty() {
                let size = if rest[0] >= 2 { 41 } else { 37 };
                entries.push(u32::from_le_bytes(rest[1..5].try_into().unwrap()) as u64);
                rest = &rest[size..];
            }
            let lengths: Vec<u64> = blobs
                .iter()
                .map(|b| b["length"].as_u64().unwrap())
                .collect();
            let offsets: Vec<u64> = blobs
                .iter()
                .map(|b| b["offset"].as_u64().unwrap())
                .collect();
            assert_eq!(entries, lengths, "the header lists the index's blocks");
            let contiguous: Vec<u64> = lengths
                .iter()
                .scan(0, |at, length| Some(std::mem::replace(at, *at + length)))
                .collect();
            assert_eq!(
                offsets, contiguous,
                "blocks lie one after another from the start"
            );
            assert_eq!(
                header_at as u64,
                lengths.iter().sum::<u64>(),
                "nothing else is in it"
            );
            for blob in blobs {
                let sealed = backend
                    .read_partial(
                        FileType::Pack,
                        &pack_id,
                        false,
                        blob["offset"].as_u64().unwrap() as u32,
                        blob["length"].as_u64().unwrap() as u32,
                    )
                    .expect("the block's bytes");
                let uncompressed = blob["uncompressed_length"]
                    .as_u64()
                    .and_then(|length| NonZeroU32::new(length as u32));
                let plain = cipher
                    .open_block(
                        sealed.into(),
                        uncompressed,
                        &mut decompressor,
                        &mut bytes::BytesMut::new(),
                    )
                    .expect("opens");
                blocks.push((blob["id"].as_str().unwrap().to_string(), plain.to_vec()));
            }
        }
    }
    blocks
}

#[test]
fn blocks_sealed_where_they_lie_read_back_as_handed_over_from_packs_laid_out_as_restic_reads_them()
{
    // 24 blocks of 384 KiB, half random (stored as they are, sealed in their own buffer) and
    // half text (compressed, sealed in the compressor's output, a few KiB each), three random
    // ones to a pack: at least 5 packs.
    const BLOCK: usize = 384 << 10;
    let blocks: Vec<Vec<u8>> = (0..24)
        .map(|seed| match seed % 2 {
            0 => test_bytes(BLOCK, seed),
            _ => format!("block {seed} says the same line again\n")
                .repeat(BLOCK / 32)
                .into_bytes(),
        })
        .collect();
    let backend = Arc::new(MemoryBackend::new());
    let cipher = Cipher::new(&MasterKey::new()).expect("a cipher");
    let mut writer = Writer::new(
        backend.clone(),
        cipher.clone(),
        WriterOptions {
            data_pack_bytes: 3 * BLOCK,
            ..WriterOptions::default()
        },
    );
    // The caller keeps one block's bytes: sealing must not change what it still holds.
    let held = Bytes::from(blocks[0].clone());
    writer
        .store(BlobType::Data, block_id(&blocks[0]), held.clone(), false)
        .expect("stored");
    for block in &blocks[1..] {
        store(&mut writer, block.clone());
    }
    let stats = writer.finish().expect("finished");
    assert_eq!(held, blocks[0], "the caller's bytes were changed");
    assert!(stats.packs >= 5, "{stats:?}");
    let mut read: Vec<_> = blocks_read_back(&backend, &cipher);
    read.sort();
    let mut expected: Vec<_> = blocks
        .iter()
        .map(|block| (hex(&block_id(block)), block.clone()))
        .collect();
    expected.sort();
    assert!(
        read == expected,
        "the blocks read back differ from those stored"
    );
}
