//! restic's authenticated encryption of every file and block: AES-256 in counter mode with
//! Poly1305-AES, under the repository's master key. A sealed item is its 16-byte nonce, the
//! ciphertext and the 16-byte MAC; one byte changed anywhere fails the MAC.

use aes256ctr_poly1305aes::Aes256CtrPoly1305Aes;
use aes256ctr_poly1305aes::aead::{Aead, AeadInPlace};
use rustic_core::repofile::MasterKey;

/// Bytes a sealed item has beyond its plaintext: nonce and MAC.
pub const OVERHEAD: usize = 32;

/// Why an item does not open.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error("the master key does not have restic's 64 bytes")]
    KeyLength,
    #[error("{0} bytes are too short for a sealed item")]
    TooShort(usize),
    #[error("the MAC does not match: altered, or sealed under another key")]
    Mac,
    #[error("no randomness for a nonce: {0}")]
    Nonce(String),
}

/// What sealing in place adds around the encrypted body: the sealed item is `nonce`, the
/// body, `tag`.
#[derive(Clone, Copy, Debug)]
pub struct Seal {
    pub nonce: [u8; 16],
    pub tag: [u8; 16],
}

/// The repository's master key, ready to seal and open.
#[derive(Clone)]
pub struct Cipher(Aes256CtrPoly1305Aes);

impl Cipher {
    pub fn new(key: &MasterKey) -> Result<Cipher, CryptoError> {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&key.encrypt);
        bytes.extend_from_slice(&key.mac.k);
        bytes.extend_from_slice(&key.mac.r);
        if bytes.len() != 64 {
            return Err(CryptoError::KeyLength);
        }
        Ok(Cipher(Aes256CtrPoly1305Aes::new(
            aes256ctr_poly1305aes::Key::from_slice(&bytes),
        )))
    }

    /// Seals `plain` under a fresh random nonce.
    pub fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let mut sealed = Vec::with_capacity(plain.len() + OVERHEAD);
        sealed.extend_from_slice(&[0; 16]);
        sealed.extend_from_slice(plain);
        let Seal { nonce, tag } = self.seal_in_place(&mut sealed[16..])?;
        sealed[..16].copy_from_slice(&nonce);
        sealed.extend_from_slice(&tag);
        Ok(sealed)
    }

    /// Encrypts `body` where it lies, under a fresh random nonce: the sealed item is the
    /// nonce, then `body`, then the MAC (no copy of a large block is made).
    pub fn seal_in_place(&self, body: &mut [u8]) -> Result<Seal, CryptoError> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|error| CryptoError::Nonce(error.to_string()))?;
        let tag = self
            .0
            .encrypt_in_place_detached(aes256ctr_poly1305aes::Nonce::from_slice(&nonce), &[], body)
            .map_err(|_| CryptoError::Mac)?;
        Ok(Seal {
            nonce,
            tag: tag.into(),
        })
    }

    /// A block as a pack holds it, opened: its plaintext, decompressed with `decompressor`
    /// when the index gives its `uncompressed` length (restic's compressed blocks), which it
    /// must then have. It is decrypted where it lies (taken without a copy when nothing else
    /// holds `sealed`'s buffer); a stored block's plaintext is a slice of it, a compressed
    /// block's is written into `room` (grown when short: a caller that gives the same buffer
    /// again saves allocating one per block) and split off it.
    pub fn open_block(
        &self,
        mut sealed: bytes::BytesMut,
        uncompressed: Option<std::num::NonZeroU32>,
        decompressor: &mut zstd::bulk::Decompressor<'_>,
        room: &mut bytes::BytesMut,
    ) -> Result<bytes::Bytes, String> {
        let plain = self
            .open_in_place(&mut sealed)
            .map_err(|error| error.to_string())?;
        let Some(length) = uncompressed else {
            return Ok(sealed.freeze().slice(plain));
        };
        let length = length.get() as usize;
        room.clear();
        room.resize(length, 0);
        let decompressed = decompressor
            .decompress_to_buffer(&sealed[plain], &mut room[..])
            .map_err(|error| format!("a block does not decompress: {error}"))?;
        if decompressed != length {
            return Err(format!(
                "a block decompresses to {decompressed} bytes where the index says {length}"
            ));
        }
        Ok(room.split().freeze())
    }

    /// Decrypts a sealed item where it lies, if its MAC holds: its plaintext is then
    /// `sealed[16..sealed.len() - 16]` (no copy of a large block is made). On a failure
    /// nothing is decrypted.
    pub fn open_in_place(&self, sealed: &mut [u8]) -> Result<std::ops::Range<usize>, CryptoError> {
        let length = sealed.len();
        if length < OVERHEAD {
            return Err(CryptoError::TooShort(length));
        }
        let (nonce, rest) = sealed.split_at_mut(16);
        let (body, tag) = rest.split_at_mut(length - OVERHEAD);
        self.0
            .decrypt_in_place_detached(
                aes256ctr_poly1305aes::Nonce::from_slice(nonce),
                &[],
                body,
                aes256ctr_poly1305aes::Tag::from_slice(tag),
            )
            .map_err(|_| CryptoError::Mac)?;
        Ok(16..length - 16)
    }

    /// The plaintext of a sealed item, if its MAC holds.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if sealed.len() < OVERHEAD {
            return Err(CryptoError::TooShort(sealed.len()));
        }
        self.0
            .decrypt(
                aes256ctr_poly1305aes::Nonce::from_slice(&sealed[..16]),
                &sealed[16..],
            )
            .map_err(|_| CryptoError::Mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_items_open_and_any_change_is_refused() {
        let cipher = Cipher::new(&MasterKey::new()).unwrap();
        let other = Cipher::new(&MasterKey::new()).unwrap();
        let plain = b"select * from orders".to_vec();
        let sealed = cipher.seal(&plain).unwrap();
        assert_eq!(sealed.len(), plain.len() + OVERHEAD);
        assert_eq!(cipher.open(&sealed).unwrap(), plain);
        // Two seals of the same plaintext differ (fresh nonce each time).
        assert_ne!(cipher.seal(&plain).unwrap(), sealed);
        for index in [0, 16, sealed.len() - 1] {
            let mut altered = sealed.clone();
            altered[index] ^= 1;
            assert_eq!(cipher.open(&altered), Err(CryptoError::Mac), "byte {index}");
        }
        assert_eq!(other.open(&sealed), Err(CryptoError::Mac));
        assert_eq!(cipher.open(&sealed[..31]), Err(CryptoError::TooShort(31)));
    }

    #[test]
    fn items_opened_in_place_hold_their_plaintext_and_any_change_is_refused() {
        let cipher = Cipher::new(&MasterKey::new()).unwrap();
        let plain = b"select * from orders".to_vec();
        let sealed = cipher.seal(&plain).unwrap();
        let mut opened = sealed.clone();
        let range = cipher.open_in_place(&mut opened).unwrap();
        assert_eq!(&opened[range], &plain[..]);
        for index in [0, 16, sealed.len() - 1] {
            let mut altered = sealed.clone();
            altered[index] ^= 1;
            assert_eq!(
                cipher.open_in_place(&mut altered),
                Err(CryptoError::Mac),
                "byte {index}"
            );
        }
        let other = Cipher::new(&MasterKey::new()).unwrap();
        assert_eq!(
            other.open_in_place(&mut sealed.clone()),
            Err(CryptoError::Mac)
        );
        assert_eq!(
            cipher.open_in_place(&mut sealed.clone()[..31]),
            Err(CryptoError::TooShort(31))
        );
    }

    #[test]
    fn a_compressed_block_opens_to_its_plaintext_and_a_changed_one_is_refused() {
        let cipher = Cipher::new(&MasterKey::new()).unwrap();
        let plain = b"insert into orders values (1, 'committed');\n".repeat(1000);
        let compressed = zstd::bulk::compress(&plain, 3).unwrap();
        let length = std::num::NonZeroU32::new(plain.len() as u32);
        let sealed = cipher.seal(&compressed).unwrap();
        let mut decompressor = zstd::bulk::Decompressor::new().unwrap();
        let mut room = bytes::BytesMut::new();
        let mut open = |sealed: &[u8], length| {
            cipher.open_block(sealed.into(), length, &mut decompressor, &mut room)
        };
        let first = open(&sealed, length).unwrap();
        assert_eq!(first, plain);
        // The next block opened into the same room never overwrites a plaintext still held.
        let other = b"update customer set name = NULL;\n".repeat(700);
        let other_sealed = cipher
            .seal(&zstd::bulk::compress(&other, 3).unwrap())
            .unwrap();
        let other_length = std::num::NonZeroU32::new(other.len() as u32);
        assert_eq!(open(&other_sealed, other_length).unwrap(), other);
        assert_eq!(first, plain);
        // Stored as it is (no uncompressed length in the index): the plaintext as sealed.
        let stored = cipher.seal(&plain).unwrap();
        assert_eq!(open(&stored, None).unwrap(), plain);
        let mut altered = sealed.clone();
        altered[sealed.len() / 2] ^= 1;
        assert!(open(&altered, length).unwrap_err().contains("MAC"));
        // Sealed whole but not zstd: named as such.
        let not_zstd = cipher.seal(&plain).unwrap();
        assert!(
            open(&not_zstd, length)
                .unwrap_err()
                .contains("does not decompress")
        );
    }
}
