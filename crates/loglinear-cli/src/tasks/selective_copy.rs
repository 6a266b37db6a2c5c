//! Selective copying (the adaptive-decay fork's `train_selective_copy.py`, spec §7.2.4).
//!
//! M distinct data tokens are scattered, in order, among noise tokens; after a separator the model
//! must reproduce them in their original order, one per position, while reading BLANKs.
//!
//! Token layout of the fork's vocabulary of 128 (only this vocabulary is supported; the fork
//! hard-codes the ranges and no other split is documented, so [`SelectiveCopyConfig::validate`]
//! rejects any other `vocab_size` rather than invent one):
//!
//! | tokens   | meaning                 |
//! |----------|-------------------------|
//! | 0        | unused                  |
//! | 1        | [`SEPARATOR`]           |
//! | 2        | [`BLANK`]               |
//! | 3..=65   | 63 [`DATA_TOKENS`]      |
//! | 66       | unused                  |
//! | 67..=127 | 61 [`NOISE_TOKENS`]     |

use std::ops::RangeInclusive;

use rand::rngs::StdRng;
use rand::seq::index;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Example, IGNORE, Region, TaskError};

/// Marks the end of the input part; the first data token is predicted here.
pub const SEPARATOR: u32 = 1;
/// Fills the output part; the 2nd..M-th data tokens are predicted at BLANKs.
pub const BLANK: u32 = 2;
/// Tokens that may have to be copied (63).
pub const DATA_TOKENS: RangeInclusive<u32> = 3..=65;
/// Tokens that are never copied (61).
pub const NOISE_TOKENS: RangeInclusive<u32> = 67..=127;
/// The only supported vocabulary size.
pub const VOCAB_SIZE: usize = 128;

fn default_num_tokens() -> usize {
    16
}

fn default_vocab_size() -> usize {
    VOCAB_SIZE
}

/// Selective copying config.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectiveCopyConfig {
    /// Sequence length T = input_len + 1 (separator) + M (blanks).
    pub seq_len: usize,
    /// M, the number of data tokens to copy (distinct; M scored positions). The fork uses 16.
    #[serde(default = "default_num_tokens")]
    pub num_tokens: usize,
    /// Vocabulary size; must be 128 (see the [module docs](self)).
    #[serde(default = "default_vocab_size")]
    pub vocab_size: usize,
}

impl SelectiveCopyConfig {
    /// A config with M = 16 and the vocabulary of 128.
    pub fn new(seq_len: usize) -> Self {
        SelectiveCopyConfig {
            seq_len,
            num_tokens: default_num_tokens(),
            vocab_size: VOCAB_SIZE,
        }
    }

    /// `input_len = T − M − 1`, the number of positions before the separator.
    pub fn input_len(&self) -> usize {
        self.seq_len.saturating_sub(self.num_tokens + 1)
    }

    /// Checks every precondition of [`generate`](Self::generate): `vocab_size` = 128;
    /// 1 ≤ M ≤ 63 (distinct data tokens); `input_len = T − M − 1 ≥ M`, i.e. T ≥ 2M + 1, so the M
    /// data tokens fit before the separator.
    pub fn validate(&self) -> Result<(), TaskError> {
        let err = |field, constraint| Err(TaskError::invalid("selective_copy", field, constraint));
        let (t, m) = (self.seq_len, self.num_tokens);
        if self.vocab_size != VOCAB_SIZE {
            return err(
                "vocab_size",
                format!(
                    "must be {VOCAB_SIZE} (the fork's token layout: 1 separator, 2 blank, \
                     3..=65 data, 67..=127 noise), got {}",
                    self.vocab_size
                ),
            );
        }
        let data = DATA_TOKENS.count();
        if m == 0 || m > data {
            return err(
                "num_tokens",
                format!("must be in 1..={data} (distinct data tokens), got {m}"),
            );
        }
        if t < 2 * m + 1 {
            return err(
                "seq_len",
                format!(
                    "must leave room for the M data tokens, the separator and M blanks \
                     (T ≥ 2M + 1), got T = {t}, M = {m}"
                ),
            );
        }
        Ok(())
    }

    /// `n` examples drawn from one `StdRng::seed_from_u64(seed)`, after [`validate`](Self::validate).
    ///
    /// Positions `0..input_len` hold noise (uniform, with replacement) with the M distinct data
    /// tokens at M sorted random positions; `input_len` holds the [`SEPARATOR`], the M positions
    /// after it [`BLANK`]. Position p predicts the label of p + 1: the target at the separator is
    /// the first data token, at BLANK i the data token i + 1, and the last position is not scored,
    /// so exactly M positions (`input_len .. T − 1`) are scored.
    ///
    /// # Worked example
    /// T = 13, M = 4, so input_len = 8, the separator at 8 and BLANKs at 9..12:
    /// ```text
    /// pos        0   1   2   3   4   5   6   7   8   9  10  11  12
    /// inputs    41   8  76  63  25  88 127 106   1   2   2   2   2
    /// targets    ·   ·   ·   ·   ·   ·   ·   ·  41   8  63  25   ·
    /// ```
    /// ```
    /// use loglinear_cli::tasks::selective_copy::{BLANK, DATA_TOKENS, SEPARATOR};
    /// use loglinear_cli::tasks::{IGNORE, SelectiveCopyConfig};
    /// let cfg = SelectiveCopyConfig { num_tokens: 4, ..SelectiveCopyConfig::new(13) };
    /// let ex = &cfg.generate(1, 3).unwrap()[0];
    /// println!("{ex}");
    /// assert_eq!(ex.inputs, [41, 8, 76, 63, 25, 88, 127, 106, 1, 2, 2, 2, 2]);
    /// assert_eq!(ex.inputs[8], SEPARATOR);
    /// assert!(ex.inputs[9..].iter().all(|&x| x == BLANK));
    /// // The data tokens of the input, in order, are the targets at positions 8..12.
    /// let data: Vec<i64> =
    ///     ex.inputs[..8].iter().filter(|x| DATA_TOKENS.contains(x)).map(|&x| x as i64).collect();
    /// assert_eq!(data, ex.targets[8..12]);
    /// assert_eq!(ex.num_scored(), 4);
    /// assert_eq!(ex.targets[12], IGNORE);
    /// ```
    pub fn generate(&self, n: usize, seed: u64) -> Result<Vec<Example>, TaskError> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(seed);
        Ok((0..n).map(|_| self.sample(&mut rng)).collect())
    }

    /// One example from `rng`; the config must be valid.
    fn sample(&self, rng: &mut StdRng) -> Example {
        let (t, m, input_len) = (self.seq_len, self.num_tokens, self.input_len());
        let data: Vec<u32> = index::sample(rng, DATA_TOKENS.count(), m)
            .into_iter()
            .map(|i| DATA_TOKENS.start() + i as u32)
            .collect();
        let mut positions = index::sample(rng, input_len, m).into_vec();
        positions.sort_unstable();

        let mut inputs: Vec<u32> = (0..input_len)
            .map(|_| rng.random_range(NOISE_TOKENS))
            .collect();
        for (&p, &d) in positions.iter().zip(&data) {
            inputs[p] = d;
        }
        inputs.push(SEPARATOR);
        inputs.resize(t, BLANK);

        let mut targets = vec![IGNORE; t];
        for (i, &d) in data.iter().enumerate() {
            targets[input_len + i] = i64::from(d);
        }
        Example { inputs, targets }
    }

    /// `"input"` 0..input_len, `"separator"` input_len..input_len+1, `"output"` input_len+1..T.
    pub fn regions(&self) -> Vec<Region> {
        let (t, n) = (self.seq_len, self.input_len());
        vec![
            Region::new("input", 0..n),
            Region::new("separator", n..n + 1),
            Region::new("output", n + 1..t),
        ]
    }

    /// E.g. `"selective_copy(V=128, T=256, M=16)"`.
    pub fn name(&self) -> String {
        format!(
            "selective_copy(V={}, T={}, M={})",
            self.vocab_size, self.seq_len, self.num_tokens
        )
    }
}
