use super::*;

/// Lengths around every boundary the functions branch on, and some long ones.
fn lengths() -> Vec<usize> {
    let mut lengths: Vec<usize> = (0..=300).collect();
    lengths.extend(REP_MOVSB_FROM - 20..REP_MOVSB_FROM + 20);
    lengths.extend([4095, 4096, 4097, 65_537]);
    lengths
}

/// Bytes that differ at every position and include values above 127.
fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|at| (at as u8).wrapping_mul(151).wrapping_add(seed))
        .collect()
}

#[test]
fn copy_copies_exactly_the_bytes_asked_at_any_alignment() {
    for n in lengths() {
        for (from, to) in [(0, 0), (1, 0), (0, 3), (7, 9), (15, 1), (8, 8)] {
            let src = pattern(n + from, 5);
            let mut dest = vec![0xAAu8; n + to + 16];
            let returned = unsafe { copy(dest.as_mut_ptr().add(to), src.as_ptr().add(from), n) };
            assert_eq!(returned, unsafe { dest.as_mut_ptr().add(to) });
            assert!(dest[..to].iter().all(|&b| b == 0xAA), "n {n}: before");
            assert_eq!(&dest[to..to + n], &src[from..], "n {n} from {from} to {to}");
            assert!(dest[to + n..].iter().all(|&b| b == 0xAA), "n {n}: after");
        }
    }
}

#[test]
fn copy_overlapping_is_memmove_for_every_shift() {
    for n in lengths().into_iter().filter(|&n| n <= 4097) {
        for shift in [
            -40isize, -17, -16, -9, -8, -1, 0, 1, 2, 8, 15, 16, 17, 33, 40,
        ] {
            let room = 48;
            let mut buffer = pattern(n + 2 * room, 11);
            let mut expected = buffer.clone();
            let from = room;
            let to = (room as isize + shift) as usize;
            expected.copy_within(from..from + n, to);
            let base = buffer.as_mut_ptr();
            unsafe { copy_overlapping(base.add(to), base.add(from), n) };
            assert_eq!(buffer, expected, "n {n} shift {shift}");
        }
    }
}

#[test]
fn fill_sets_exactly_the_bytes_asked() {
    for n in lengths() {
        for (to, byte) in [(0, 0u8), (3, 0xFF), (9, 0x5C)] {
            let mut dest = vec![0xAAu8; n + to + 16];
            let returned = unsafe { fill(dest.as_mut_ptr().add(to), byte, n) };
            assert_eq!(returned, unsafe { dest.as_mut_ptr().add(to) });
            assert!(dest[..to].iter().all(|&b| b == 0xAA));
            assert!(
                dest[to..to + n].iter().all(|&b| b == byte),
                "n {n} byte {byte}"
            );
            assert!(dest[to + n..].iter().all(|&b| b == 0xAA));
        }
    }
}

#[test]
fn compare_orders_as_the_first_differing_byte_does() {
    for n in (0..=80).chain([255, 256, 257, 4097]) {
        let a = pattern(n + 1, 3);
        // Equal, at every alignment.
        for offset in [0, 1] {
            let b = a.clone();
            assert_eq!(
                unsafe { compare(a[offset..].as_ptr(), b[offset..].as_ptr(), n) },
                0
            );
            assert_eq!(
                unsafe { differ(a[offset..].as_ptr(), b[offset..].as_ptr(), n) },
                0
            );
        }
        // One byte lower or higher at each position, with a later byte the other way (it must
        // not decide), and across the sign bit.
        for at in 0..n {
            for (mine, theirs) in [(0x00u8, 0x01u8), (0x7F, 0x80), (0xFE, 0xFF), (0x01, 0xF0)] {
                let (mut x, mut y) = (a[..n].to_vec(), a[..n].to_vec());
                x[at] = mine;
                y[at] = theirs;
                if at + 1 < n {
                    x[at + 1] = 0xFF;
                    y[at + 1] = 0x00;
                }
                let expected = x.cmp(&y) as i32;
                let got = unsafe { compare(x.as_ptr(), y.as_ptr(), n) };
                assert_eq!(got.signum(), expected, "n {n} at {at}");
                let back = unsafe { compare(y.as_ptr(), x.as_ptr(), n) };
                assert_eq!(back.signum(), -expected, "n {n} at {at}, reversed");
                assert_ne!(
                    unsafe { differ(x.as_ptr(), y.as_ptr(), n) },
                    0,
                    "n {n} at {at}"
                );
            }
        }
    }
}

#[test]
fn a_long_copy_and_fill_go_past_the_rep_movsb_threshold_unchanged() {
    // The lengths above cover both sides of REP_MOVSB_FROM; this pins that it is a length
    // those tests reach, so that moving it cannot leave a path untested.
    assert!(lengths().contains(&(REP_MOVSB_FROM - 1)));
    assert!(lengths().contains(&REP_MOVSB_FROM));
    assert!(lengths().iter().any(|&n| n > 2 * REP_MOVSB_FROM));
}
