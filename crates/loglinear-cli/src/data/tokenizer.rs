//! GPT-2 byte-level BPE (`r50k_base`, the tokenizer of GPT-2 and of spec §7.2.5).
//!
//! The merge ranks are compiled into the `tiktoken-rs` crate (`include_str!` of
//! `assets/r50k_base.tiktoken`), so nothing is downloaded at run time.

use std::sync::OnceLock;

use rayon::prelude::*;
use tiktoken_rs::CoreBPE;

use super::{EOT_ID, VOCAB_SIZE};

/// Texts longer than this are cut into pieces (at boundaries that cannot change the result, see
/// [`safe_chunks`]) and encoded in parallel.
const PARALLEL_CHUNK_BYTES: usize = 1 << 20;

/// The GPT-2 tokenizer: 50,257 ids, `<|endoftext|>` = 50256.
///
/// [`encode`](Self::encode) treats every character of the input as text: a literal
/// `<|endoftext|>` in the data is encoded as ordinary text, never as the special id (tiktoken's
/// `encode_ordinary`). Document separators are inserted by the caller as [`EOT_ID`].
#[derive(Clone, Copy)]
pub struct Gpt2Tokenizer {
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer(r50k_base)")
    }
}

impl Default for Gpt2Tokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Gpt2Tokenizer {
    /// The shared tokenizer (the ranks are parsed once per process, about 0.1 s).
    pub fn new() -> Self {
        static BPE: OnceLock<CoreBPE> = OnceLock::new();
        let bpe = BPE.get_or_init(|| {
            tiktoken_rs::r50k_base().expect("the r50k_base ranks embedded in tiktoken-rs parse")
        });
        Self { bpe }
    }

    /// Number of ids (50,257).
    pub fn vocab_size(&self) -> usize {
        VOCAB_SIZE
    }

    /// The id of `<|endoftext|>` (50,256).
    pub fn eot_id(&self) -> u32 {
        EOT_ID
    }

    /// Token ids of `text` (special-token strings are encoded as plain text).
    ///
    /// Long texts are encoded in parallel pieces; the result equals encoding the whole string at
    /// once (see [`safe_chunks`]).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if text.len() <= PARALLEL_CHUNK_BYTES {
            return self.bpe.encode_ordinary(text);
        }
        let pieces: Vec<Vec<u32>> = safe_chunks(text, PARALLEL_CHUNK_BYTES)
            .par_iter()
            .map(|piece| self.bpe.encode_ordinary(piece))
            .collect();
        let mut out = Vec::with_capacity(pieces.iter().map(Vec::len).sum());
        for piece in pieces {
            out.extend_from_slice(&piece);
        }
        out
    }

    /// Text of `ids`. Bytes that do not form valid UTF-8 (a multi-byte character cut between two
    /// ids, e.g. at the end of a generated sequence) become U+FFFD. Ids outside the vocabulary
    /// are rendered as `<|id=N|>` rather than failing.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            match self.bpe.decode_bytes(&[id]) {
                Ok(b) => bytes.extend_from_slice(&b),
                Err(_) => bytes.extend_from_slice(format!("<|id={id}|>").as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Cuts `text` into pieces of roughly `target` bytes whose separate encodings concatenate to the
/// encoding of the whole text.
///
/// A cut is made only just before a `'\n'` whose preceding character is not whitespace. GPT-2's
/// pre-tokenizer pattern (`'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|
/// \s+(?!\S)|\s`) never matches a piece that contains both a non-whitespace character and a
/// following `'\n'`, so such a position is always a piece boundary; the piece before the cut ends
/// in non-whitespace, so the end-anchored `\s++$` alternative cannot fire differently either.
/// Text without such a position stays in one piece.
pub fn safe_chunks(text: &str, target: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut start = 0;
    while text.len() - start > target {
        let mut cut = None;
        let mut i = start + target;
        while i < bytes.len() {
            if bytes[i] == b'\n'
                && !bytes[i - 1].is_ascii_whitespace()
                && !ends_in_unicode_space(&text[..i])
            {
                cut = Some(i);
                break;
            }
            i += 1;
        }
        match cut {
            Some(c) => {
                pieces.push(&text[start..c]);
                start = c;
            }
            None => break,
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// Whether the last character of `s` is (non-ASCII) whitespace, which `\s` also matches.
fn ends_in_unicode_space(s: &str) -> bool {
    s.chars().next_back().is_some_and(char::is_whitespace)
}
