//! The backup side: the volume as a tar stream, in manifest order, written while the manifest
//! is built (one read of every file for both).

use std::io::{self, Read, Write};

use custody_proto::manifest::{Entry, Kind};

use crate::manifest_builder::Archive;
use crate::tree::Metadata;

/// Writes entries into a tar stream.
pub struct TarArchive<W: Write> {
    builder: tar::Builder<W>,
}

impl<W: Write> TarArchive<W> {
    pub fn new(out: W) -> TarArchive<W> {
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Deterministic);
        TarArchive { builder }
    }

    /// Writes the end-of-archive blocks and returns the writer.
    pub fn finish(self) -> io::Result<W> {
        self.builder.into_inner()
    }
}

fn header(kind: tar::EntryType, mode: u32, uid: u32, gid: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(uid.into());
    header.set_gid(gid.into());
    header.set_size(size);
    header.set_mtime(0);
    header
}

impl<W: Write> Archive for TarArchive<W> {
    fn entry(&mut self, entry: &Entry) -> io::Result<()> {
        match &entry.kind {
            Kind::Dir => {
                let mut header = header(
                    tar::EntryType::Directory,
                    entry.mode,
                    entry.uid,
                    entry.gid,
                    0,
                );
                self.builder
                    .append_data(&mut header, &entry.path, io::empty())
            }
            Kind::Symlink { target } => {
                let mut header =
                    header(tar::EntryType::Symlink, entry.mode, entry.uid, entry.gid, 0);
                self.builder.append_link(&mut header, &entry.path, target)
            }
            Kind::File { .. } => Err(io::Error::other("files are added with their content")),
        }
    }

    fn file(&mut self, path: &str, metadata: &Metadata, content: &mut dyn Read) -> io::Result<()> {
        let mut header = header(
            tar::EntryType::Regular,
            metadata.mode,
            metadata.uid,
            metadata.gid,
            metadata.size,
        );
        // A file that shrank while it was read would leave the entry short; the builder
        // reports it and the backup fails rather than record a torn file.
        let mut counted = Counted {
            inner: content,
            read: 0,
        };
        self.builder.append_data(&mut header, path, &mut counted)?;
        if counted.read != metadata.size {
            return Err(io::Error::other(format!(
                "{path} changed while it was read ({} bytes expected, {} read)",
                metadata.size, counted.read
            )));
        }
        super::progress::file();
        Ok(())
    }
}

struct Counted<'a> {
    inner: &'a mut dyn Read,
    read: u64,
}

impl Read for Counted<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.read += read as u64;
        super::progress::bytes(read as u64);
        Ok(read)
    }
}
