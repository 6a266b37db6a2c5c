//! Token files on disk: raw little-endian `u16` ids (no header, the nanoGPT `.bin` layout),
//! memory-mapped for reading and written atomically.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;

#[cfg(not(target_endian = "little"))]
compile_error!(
    "token files are read as little-endian u16 in place; big-endian hosts are not supported"
);

/// One split's token ids, memory-mapped read-only.
///
/// The file is `len() × 2` bytes of little-endian `u16`. [`get`](Self::get) borrows the ids in
/// place (no copy); [`get_u32`](Self::get_u32) widens a range for model inputs.
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .field("len", &self.len())
            .finish()
    }
}

impl TokenFile {
    /// Maps `path`. Errors (naming the file) if it cannot be read, is empty, or has an odd number
    /// of bytes (not a `u16` token file).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path)
            .with_context(|| format!("cannot open token file {}", path.display()))?;
        let bytes = file
            .metadata()
            .with_context(|| format!("cannot stat token file {}", path.display()))?
            .len();
        if bytes == 0 {
            bail!("token file {} is empty (0 tokens)", path.display());
        }
        if bytes % 2 != 0 {
            bail!(
                "token file {} has an odd length ({bytes} bytes): expected little-endian u16 token ids (2 bytes each)",
                path.display()
            );
        }
        // SAFETY: the map is read-only; like every reader of a memory-mapped file we rely on the
        // file not being truncated while it is open (prepare replaces files by rename, which
        // leaves this inode intact).
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot memory-map {}", path.display()))?;
        Ok(Self { path, map })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.map.len() / 2
    }

    /// Always false for an opened file (empty files are rejected by [`open`](Self::open)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All ids.
    pub fn as_slice(&self) -> &[u16] {
        // SAFETY: a memory map starts on a page boundary, so it is aligned for u16, and its length
        // is even (checked in `open`); every bit pattern is a valid u16.
        let (head, ids, tail) = unsafe { self.map.align_to::<u16>() };
        debug_assert!(head.is_empty() && tail.is_empty());
        ids
    }

    /// Ids in `range` (panics if the range is out of bounds, like slice indexing).
    pub fn get(&self, range: Range<usize>) -> &[u16] {
        &self.as_slice()[range]
    }

    /// Ids in `range`, widened to `u32`.
    pub fn get_u32(&self, range: Range<usize>) -> Vec<u32> {
        self.get(range).iter().map(|&t| u32::from(t)).collect()
    }

    /// The largest id and its position.
    pub fn max_id(&self) -> (usize, u16) {
        let ids = self.as_slice();
        let mut best = (0, ids[0]);
        for (i, &t) in ids.iter().enumerate() {
            if t > best.1 {
                best = (i, t);
            }
        }
        best
    }

    /// Errors (naming the file, the position and the id) if any id is `>= vocab_size`.
    pub fn check_ids(&self, vocab_size: usize) -> Result<()> {
        check_ids(self.as_slice(), vocab_size, &self.path)
    }
}

/// Errors if some id in `ids` is `>= vocab_size`, naming `path`, the first such position and id.
pub(crate) fn check_ids(ids: &[u16], vocab_size: usize, path: &Path) -> Result<()> {
    if vocab_size > usize::from(u16::MAX) + 1 {
        return Ok(());
    }
    if let Some(pos) = ids.iter().position(|&t| usize::from(t) >= vocab_size) {
        bail!(
            "{}: token id {} at position {pos} is outside the vocabulary (vocab_size {vocab_size}: ids must be < {vocab_size})",
            path.display(),
            ids[pos]
        );
    }
    Ok(())
}

/// The temporary name next to `path` that an atomic write goes through.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes `path` atomically: the content goes to a temporary file in the same directory, is
/// flushed to disk, and is renamed over `path`. A process killed midway leaves at most a
/// `.NAME.tmp-PID` file, never a half-written `path`.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<()> {
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent()
            && let Ok(d) = File::open(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            })
        {
            let _ = d.sync_all(); // best effort: persist the rename itself
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// Writes `ids` as little-endian `u16` to `path`, atomically (see [`write_atomic`]).
pub fn write_tokens(path: &Path, ids: &[u16]) -> Result<()> {
    write_atomic(path, |w| {
        for chunk in ids.chunks(1 << 16) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
            w.write_all(&bytes)?;
        }
        Ok(())
    })
}

/// Reads a whole `u16` token file into memory, checking its length (named in errors).
pub fn read_tokens(path: &Path) -> Result<Vec<u16>> {
    Ok(TokenFile::open(path)?.as_slice().to_vec())
}
