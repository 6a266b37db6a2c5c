//! A prepared corpus directory ([`LmData`]): `meta.json` plus one token file per split, cut into
//! next-token windows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::tokens::TokenFile;
use super::{IGNORE, META_FILE};

/// Version of the prepared-directory layout written into `meta.json`.
pub const FORMAT_VERSION: u32 = 1;

/// Contents of `meta.json`, the description of a prepared directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Tokenizer family: `"gpt2"`.
    pub tokenizer: String,
    /// The BPE encoding's tiktoken name: `"r50k_base"`.
    pub encoding: String,
    /// Number of ids; every token is `< vocab_size` (50,257 for GPT-2).
    pub vocab_size: usize,
    /// The `<|endoftext|>` id (50,256).
    pub eot_id: u32,
    /// Element type of the token files: `"u16le"` (little-endian u16, no header).
    pub dtype: String,
    /// Canonical split name (`train`, `valid`, `test`) → file and token count.
    pub splits: BTreeMap<String, SplitMeta>,
    /// Where the tokens came from.
    pub source: SourceMeta,
    /// How the source was divided into the splits, in words.
    pub split_rule: String,
    /// How documents / lines are separated in the token stream, in words.
    pub document_separator: String,
}

/// One split in [`Meta`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitMeta {
    /// File name inside the prepared directory, e.g. `train.bin`.
    pub file: String,
    /// Number of tokens in the file.
    pub tokens: u64,
    /// Number of source documents in the split, where the format has documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<u64>,
}

/// The source of a prepared directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceMeta {
    /// `--format` that prepared it (`text`, `wikitext`, `parquet`, `nanogpt`, `sotu`).
    pub format: String,
    /// File name of `--input` (the last path component only).
    pub input: String,
    /// What the corpus is, in words.
    pub description: String,
}

/// The canonical name of a split: `validation` and `val` are aliases of `valid`.
pub fn canonical_split(name: &str) -> &str {
    match name {
        "validation" | "val" => "valid",
        other => other,
    }
}

/// Number of windows that cover a split of `n_tokens` tokens at sequence length `seq_len`:
/// every token but the first is a target exactly once, so `ceil((n − 1) / T)`.
pub fn num_windows(n_tokens: usize, seq_len: usize) -> usize {
    assert!(seq_len > 0, "seq_len must be positive");
    n_tokens.saturating_sub(1).div_ceil(seq_len)
}

/// Number of complete windows (all `T` targets real): `floor((n − 1) / T)`. The training
/// sampler draws only these.
pub fn num_full_windows(n_tokens: usize, seq_len: usize) -> usize {
    assert!(seq_len > 0, "seq_len must be positive");
    n_tokens.saturating_sub(1) / seq_len
}

/// Window `i` of `tokens` at sequence length `T`: `inputs[j] = tokens[i·T + j]` and
/// `targets[j] = tokens[i·T + j + 1]` (the label shift, applied once, here). Positions past the
/// end of the split have input `pad` and target [`IGNORE`]. Panics if `i >= num_windows`.
pub fn window_of(tokens: &[u16], i: usize, seq_len: usize, pad: u32) -> (Vec<u32>, Vec<i64>) {
    assert!(
        i < num_windows(tokens.len(), seq_len),
        "window {i} out of range"
    );
    let start = i * seq_len;
    let mut inputs = Vec::with_capacity(seq_len);
    let mut targets = Vec::with_capacity(seq_len);
    for j in 0..seq_len {
        let p = start + j;
        inputs.push(tokens.get(p).map_or(pad, |&t| u32::from(t)));
        targets.push(tokens.get(p + 1).map_or(IGNORE, |&t| i64::from(t)));
    }
    (inputs, targets)
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny generator whose stream is fixed by this code,
/// not by a crate version, so shuffles stay reproducible across dependency upgrades.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-high; bias below 2⁻³² for the sizes used here).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// The order in which epoch `epoch` of a run seeded `seed` visits `n` training windows: a
/// Fisher–Yates shuffle of `0..n` (from the top: for `i = n−1 … 1` swap `i` with a uniform
/// `j ∈ 0..=i`) driven by SplitMix64 started at `splitmix(seed) ⊕ splitmix(epoch ⊕ 0x5851F42D4C957F2D)`.
pub fn epoch_permutation(seed: u64, epoch: u64, n: usize) -> Vec<u32> {
    assert!(
        u32::try_from(n).is_ok(),
        "too many windows for a u32 permutation"
    );
    let state = SplitMix64(seed).next() ^ SplitMix64(epoch ^ 0x5851_F42D_4C95_7F2D).next();
    let mut rng = SplitMix64(state);
    let mut perm: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        perm.swap(i, j);
    }
    perm
}

/// The training windows of batch `step` (a pure function of `(seed, step, batch, n_windows)`):
/// step `s` takes the global slots `s·B … s·B + B − 1` of the endless sequence
/// "epoch 0's permutation, then epoch 1's, …"; slot `g` is window
/// `epoch_permutation(seed, g / n, n)[g % n]`. Consecutive steps therefore walk through every
/// window once per epoch, and a run resumed at step `s` sees exactly the batches it would have
/// seen.
pub fn train_window_ids(seed: u64, step: u64, batch: usize, n_windows: usize) -> Vec<usize> {
    let mut cache: Vec<(u64, Vec<u32>)> = Vec::new();
    train_window_ids_with(step, batch, n_windows, |epoch| {
        if let Some((_, p)) = cache.iter().find(|(e, _)| *e == epoch) {
            return Arc::new(p.clone());
        }
        let p = epoch_permutation(seed, epoch, n_windows);
        cache.push((epoch, p.clone()));
        Arc::new(p)
    })
}

fn train_window_ids_with(
    step: u64,
    batch: usize,
    n_windows: usize,
    mut perm: impl FnMut(u64) -> Arc<Vec<u32>>,
) -> Vec<usize> {
    assert!(n_windows > 0, "no training windows");
    let n = n_windows as u64;
    let first = step
        .checked_mul(batch as u64)
        .expect("step × batch overflows u64");
    let mut out = Vec::with_capacity(batch);
    let mut current: Option<(u64, Arc<Vec<u32>>)> = None;
    for b in 0..batch as u64 {
        let g = first + b;
        let (epoch, idx) = (g / n, (g % n) as usize);
        if current.as_ref().is_none_or(|(e, _)| *e != epoch) {
            current = Some((epoch, perm(epoch)));
        }
        out.push(current.as_ref().expect("set above").1[idx] as usize);
    }
    out
}

/// `(seed, number of windows, epoch)` of a cached epoch permutation.
type PermKey = (u64, usize, u64);

/// A prepared directory, opened: `meta.json` plus memory-mapped token files.
///
/// ```no_run
/// # fn main() -> anyhow::Result<()> {
/// use loglinear_cli::data::LmData;
/// let data = LmData::open("data/sotu/prepared")?;
/// let n = data.windows("valid", 512)?; // every validation token scored once
/// let (inputs, targets) = data.window("valid", n - 1, 512)?; // last window, tail = -100
/// let (x, y) = data.sample_train_batch(0, 1234, 8, 512)?; // 8×512, same for every resume
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LmData {
    dir: PathBuf,
    meta: Meta,
    splits: BTreeMap<String, TokenFile>,
    perm_cache: Mutex<Vec<(PermKey, Arc<Vec<u32>>)>>,
}

impl LmData {
    /// Opens a directory written by `loglinear data prepare`. Checks that `meta.json` parses,
    /// that its vocabulary fits `u16` files, that every split file exists with the recorded number
    /// of tokens, and that every id is below `vocab_size` (one pass over the data).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).with_context(|| {
            format!(
                "cannot read {} (is {} a directory made by `loglinear data prepare`?)",
                meta_path.display(),
                dir.display()
            )
        })?;
        let meta: Meta = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid meta.json", meta_path.display()))?;
        ensure!(
            meta.format_version == FORMAT_VERSION,
            "{}: format_version {} is not supported (expected {FORMAT_VERSION})",
            meta_path.display(),
            meta.format_version
        );
        ensure!(
            meta.dtype == "u16le",
            "{}: dtype {:?} is not supported (expected \"u16le\")",
            meta_path.display(),
            meta.dtype
        );
        ensure!(
            meta.vocab_size >= 1 && meta.vocab_size <= usize::from(u16::MAX) + 1,
            "{}: vocab_size {} is larger than u16 token files can hold (at most 65536 ids)",
            meta_path.display(),
            meta.vocab_size
        );
        ensure!(
            (meta.eot_id as usize) < meta.vocab_size,
            "{}: eot_id {} is not below vocab_size {}",
            meta_path.display(),
            meta.eot_id,
            meta.vocab_size
        );
        ensure!(
            !meta.splits.is_empty(),
            "{}: lists no splits",
            meta_path.display()
        );
        let mut splits = BTreeMap::new();
        for (name, s) in &meta.splits {
            ensure!(
                !s.file.is_empty()
                    && Path::new(&s.file).file_name() == Some(std::ffi::OsStr::new(&s.file)),
                "{}: split {name}: file {:?} must be a plain file name inside the directory",
                meta_path.display(),
                s.file
            );
            let file = TokenFile::open(dir.join(&s.file))
                .with_context(|| format!("split {name} of {}", dir.display()))?;
            ensure!(
                file.len() as u64 == s.tokens,
                "{}: meta.json says {} tokens but the file holds {}",
                file.path().display(),
                s.tokens,
                file.len()
            );
            file.check_ids(meta.vocab_size)?;
            splits.insert(canonical_split(name).to_string(), file);
        }
        Ok(Self {
            dir,
            meta,
            splits,
            perm_cache: Mutex::new(Vec::new()),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `meta.json`.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Canonical names of the splits present (`train`, `valid`, `test`, sorted).
    pub fn split_names(&self) -> Vec<&str> {
        self.splits.keys().map(String::as_str).collect()
    }

    /// The token file of split `name` (`valid`, `validation` and `val` are the same split).
    /// Unknown names are an error that lists the available splits.
    pub fn split(&self, name: &str) -> Result<&TokenFile> {
        match self.splits.get(canonical_split(name)) {
            Some(f) => Ok(f),
            None => {
                let avail: Vec<String> = self
                    .splits
                    .keys()
                    .map(|k| {
                        if k == "valid" {
                            "valid (alias: validation)".to_string()
                        } else {
                            k.clone()
                        }
                    })
                    .collect();
                bail!(
                    "unknown split `{name}` in {}: available splits: {}",
                    self.dir.display(),
                    avail.join(", ")
                )
            }
        }
    }

    /// Number of evaluation windows of `split` at `seq_len`: `ceil((n − 1) / seq_len)`, the last
    /// one possibly partial (see [`window`](Self::window)).
    pub fn windows(&self, split: &str, seq_len: usize) -> Result<usize> {
        ensure!(seq_len > 0, "seq_len must be positive");
        Ok(num_windows(self.split(split)?.len(), seq_len))
    }

    /// Window `i` of `split`: `inputs = tokens[i·T .. (i+1)·T]`,
    /// `targets = tokens[i·T+1 .. (i+1)·T+1]` — the labels are shifted exactly once, here, so
    /// `targets[j] == inputs[j+1]` and the model compares `logits[j]` with `targets[j]` directly.
    ///
    /// The windows do not overlap and together score every token of the split except the first
    /// exactly once, so a perplexity over all windows covers the WHOLE split: the last window is
    /// kept even when partial; its positions past the end have input [`Meta::eot_id`] (padding)
    /// and target [`IGNORE`] (−100), so they are not scored.
    pub fn window(&self, split: &str, i: usize, seq_len: usize) -> Result<(Vec<u32>, Vec<i64>)> {
        let n = self.windows(split, seq_len)?;
        ensure!(
            i < n,
            "window {i} out of range: split {split} has {n} windows at seq_len {seq_len}"
        );
        Ok(window_of(
            self.split(split)?.as_slice(),
            i,
            seq_len,
            self.meta.eot_id,
        ))
    }

    /// Windows `first .. first + count` (clipped to the split) of `split`, concatenated row-major
    /// (`rows × seq_len`); returns the number of rows too. For evaluation loops.
    pub fn window_batch(
        &self,
        split: &str,
        first: usize,
        count: usize,
        seq_len: usize,
    ) -> Result<(usize, Vec<u32>, Vec<i64>)> {
        let n = self.windows(split, seq_len)?;
        let end = first.saturating_add(count).min(n);
        let tokens = self.split(split)?.as_slice();
        let rows = end.saturating_sub(first);
        let mut x = Vec::with_capacity(rows * seq_len);
        let mut y = Vec::with_capacity(rows * seq_len);
        for i in first..end {
            let (a, b) = window_of(tokens, i, seq_len, self.meta.eot_id);
            x.extend(a);
            y.extend(b);
        }
        Ok((rows, x, y))
    }

    /// Number of complete training windows at `seq_len` (what the sampler draws from).
    pub fn train_windows(&self, seq_len: usize) -> Result<usize> {
        ensure!(seq_len > 0, "seq_len must be positive");
        Ok(num_full_windows(self.split("train")?.len(), seq_len))
    }

    /// Training batch `step`: `batch` complete, non-overlapping windows of the `train` split,
    /// concatenated row-major (`batch × seq_len` inputs and targets, targets shifted once as in
    /// [`window`](Self::window)). Which windows is a pure function of `(seed, step)` (see
    /// [`train_window_ids`]): each epoch is a seeded permutation of all complete windows and
    /// step `s` takes the next `batch` of them, so a resumed run sees the same batches.
    pub fn sample_train_batch(
        &self,
        seed: u64,
        step: u64,
        batch: usize,
        seq_len: usize,
    ) -> Result<(Vec<u32>, Vec<i64>)> {
        let w = self.train_windows(seq_len)?;
        let train = self.split("train")?;
        ensure!(
            w > 0,
            "{}: the train split has {} tokens, too few for one window of {seq_len} (+1 target)",
            train.path().display(),
            train.len()
        );
        let ids = train_window_ids_with(step, batch, w, |epoch| {
            self.cached_permutation(seed, w, epoch)
        });
        let tokens = train.as_slice();
        let mut x = Vec::with_capacity(batch * seq_len);
        let mut y = Vec::with_capacity(batch * seq_len);
        for i in ids {
            let (a, b) = window_of(tokens, i, seq_len, self.meta.eot_id);
            x.extend(a);
            y.extend(b);
        }
        Ok((x, y))
    }

    fn cached_permutation(&self, seed: u64, n: usize, epoch: u64) -> Arc<Vec<u32>> {
        let key = (seed, n, epoch);
        let mut cache = self.perm_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(k, _)| *k == key) {
            return Arc::clone(p);
        }
        let p = Arc::new(epoch_permutation(seed, epoch, n));
        if cache.len() >= 4 {
            cache.remove(0);
        }
        cache.push((key, Arc::clone(&p)));
        p
    }
}
