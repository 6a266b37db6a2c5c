//! Multi-query associative recall (MQAR; Arora et al., "Zoology", 2023).
//!
//! A sequence starts with K key-value pairs `k1 v1 … kK vK`; later every key appears once more as a
//! query, and the model must output the paired value **at the query token**. Keys come from
//! `1..V/2` and values from `V/2..V` (both K distinct per example, paired in order), so a key and a
//! value can never be confused. Two layouts:
//!
//! * [`MqarLayout::Zoology`]: zoology's `multiquery_ar` (spec §7.4), the standard benchmark. Queries
//!   sit at even offsets `2K + 2·gap` after the context, with distinct gaps drawn from a power law
//!   (`p(gap = i−1) ∝ a·i^(a−1)`, a = `power_a`), so most queries are close to the context.
//! * [`MqarLayout::Seed`]: the adaptive-decay fork's generator (spec §7.2.1), generalised from
//!   V = 128 to any V. All K queries form a block at the end (`T − 2K ..`), in a random order, so
//!   every query is about T positions away from its key.
//!
//! Both match the Python generators in distribution, not bit for bit (see the [module
//! docs](super)). Draw order per example: keys, values, query placement, then the filler tokens.

use std::ops::Range;

use rand::rngs::StdRng;
use rand::seq::index;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Example, IGNORE, Region, TaskError};

/// Where the queries go; see the [module docs](self).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MqarLayout {
    /// zoology `multiquery_ar`: power-law gaps after the context (spec §7.4).
    #[default]
    Zoology,
    /// The adaptive-decay fork: all queries in a block at the end (spec §7.2.1).
    Seed,
}

/// Default of [`MqarConfig::power_a`], zoology's value.
pub const DEFAULT_POWER_A: f64 = 0.01;

fn default_power_a() -> f64 {
    DEFAULT_POWER_A
}

fn default_true() -> bool {
    true
}

/// Multi-query associative recall config.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqarConfig {
    /// Vocabulary size V. Keys are drawn from `1..V/2`, values from `V/2..V`. zoology uses 8192 and
    /// requires V > T; the fork uses 128.
    pub vocab_size: usize,
    /// Sequence length T (even for the zoology layout).
    pub seq_len: usize,
    /// K, the number of key-value pairs, each queried exactly once (K scored positions).
    pub num_kv_pairs: usize,
    /// Query placement.
    #[serde(default)]
    pub layout: MqarLayout,
    /// Exponent a of the power law of the query gaps (zoology layout only).
    #[serde(default = "default_power_a")]
    pub power_a: f64,
    /// Replace the filler zeros by uniform random tokens: from `0..V` in the zoology layout (so a
    /// filler can equal a key or value), from `1..V` in the seed layout. When false the filler
    /// stays 0 (a token that is never a key or value).
    #[serde(default = "default_true")]
    pub random_non_queries: bool,
}

impl MqarConfig {
    /// A config with the defaults of the optional fields (zoology layout, a = 0.01, random filler).
    pub fn new(vocab_size: usize, seq_len: usize, num_kv_pairs: usize) -> Self {
        MqarConfig {
            vocab_size,
            seq_len,
            num_kv_pairs,
            layout: MqarLayout::Zoology,
            power_a: DEFAULT_POWER_A,
            random_non_queries: true,
        }
    }

    /// Checks every precondition of [`generate`](Self::generate).
    ///
    /// Both layouts: K ≥ 1; 4K ≤ T (2K context tokens plus 2K query slots must fit); K ≤ V/2 − 1
    /// keys available in `1..V/2` (and so K ≤ V − V/2 values); V < 2³² (u32 tokens).
    /// Zoology layout also: T even, V > T, `power_a` finite and > 0. Seed layout: `power_a` left at
    /// its default (it has no gaps, so another value would be silently ignored).
    pub fn validate(&self) -> Result<(), TaskError> {
        let err = |field, constraint| Err(TaskError::invalid("mqar", field, constraint));
        let (v, t, k) = (self.vocab_size, self.seq_len, self.num_kv_pairs);
        if k == 0 {
            return err("num_kv_pairs", "must be at least 1".into());
        }
        if u32::try_from(v).is_err() {
            return err(
                "vocab_size",
                format!("must be below 2^32 (u32 tokens), got {v}"),
            );
        }
        if self.layout == MqarLayout::Zoology {
            if t % 2 != 0 {
                return err(
                    "seq_len",
                    format!("must be even in the zoology layout, got {t}"),
                );
            }
            if v <= t {
                return err(
                    "vocab_size",
                    format!(
                        "must exceed seq_len in the zoology layout (V > T), got V = {v}, T = {t}"
                    ),
                );
            }
            if !(self.power_a.is_finite() && self.power_a > 0.0) {
                return err(
                    "power_a",
                    format!("must be finite and > 0, got {}", self.power_a),
                );
            }
        } else if self.power_a != DEFAULT_POWER_A {
            return err(
                "power_a",
                format!(
                    "only applies to the zoology layout (the seed layout has no gaps); \
                     leave it at {DEFAULT_POWER_A}, got {}",
                    self.power_a
                ),
            );
        }
        if k.saturating_mul(4) > t {
            return err(
                "num_kv_pairs",
                format!(
                    "2K context tokens and 2K query slots must fit in seq_len (4K ≤ T), \
                     got K = {k}, T = {t}"
                ),
            );
        }
        if k > (v / 2).saturating_sub(1) {
            return err(
                "num_kv_pairs",
                format!(
                    "needs K distinct keys from 1..V/2 (K ≤ V/2 − 1), got K = {k}, V = {v} ({} keys)",
                    (v / 2).saturating_sub(1)
                ),
            );
        }
        Ok(())
    }

    /// `n` examples drawn from one `StdRng::seed_from_u64(seed)`, after [`validate`](Self::validate).
    ///
    /// # Worked example, zoology layout
    /// V = 20 (keys 1..=9, values 10..=19), T = 16, K = 2, filler left at 0 for readability
    /// (`random_non_queries = true`, the default, replaces every 0 by a uniform token from 0..=19).
    /// The context is `k1 v1 k2 v2` at positions 0..3; the query region 4..15 has room for
    /// `space = (T − 2K)/2 = 6` gaps, and key j is repeated at `2K + 2·gap_j`; the target at that
    /// position is v_j, every other target is ignored (`·`):
    /// ```text
    /// pos       0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    /// inputs    6 18  1 13  0  0  6  0  0  0  0  0  0  0  1  0
    /// targets   ·  ·  ·  ·  ·  · 18  ·  ·  ·  ·  ·  ·  · 13  ·
    /// ```
    /// ```
    /// use loglinear_cli::tasks::{IGNORE, MqarConfig};
    /// let cfg = MqarConfig { random_non_queries: false, ..MqarConfig::new(20, 16, 2) };
    /// let ex = &cfg.generate(1, 3).unwrap()[0];
    /// println!("{ex}");
    /// assert_eq!(ex.inputs, [6, 18, 1, 13, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    /// // Context: keys in 1..10 at even positions, each followed by its value in 10..20.
    /// for j in 0..2 {
    ///     assert!((1..10).contains(&ex.inputs[2 * j]) && (10..20).contains(&ex.inputs[2 * j + 1]));
    /// }
    /// // Exactly K scored positions, all at even offsets in the query region, and each target is
    /// // the value paired with the key found at that position.
    /// let scored: Vec<usize> = (0..16).filter(|&p| ex.targets[p] != IGNORE).collect();
    /// assert_eq!(scored, [6, 14]); // gaps 1 and 5
    /// for &p in &scored {
    ///     let j = (0..2).find(|&j| ex.inputs[2 * j] == ex.inputs[p]).unwrap();
    ///     assert_eq!(ex.targets[p], ex.inputs[2 * j + 1] as i64);
    /// }
    /// ```
    ///
    /// # Worked example, seed layout
    /// V = 16 (keys 1..=7, values 8..=15), T = 12, K = 2: pairs at 0..3, filler at 4..7, the query
    /// block at `T − 2K = 8..11` with the keys in a random order at 8 and 10; every other slot
    /// (filler and the slot after each query) holds a uniform token from 1..=15:
    /// ```text
    /// pos       0  1  2  3  4  5  6  7  8  9 10 11
    /// inputs    4 14  1 10 11  7 10  4  1  3  4  7
    /// targets   ·  ·  ·  ·  ·  ·  ·  · 10  · 14  ·
    /// ```
    /// ```
    /// use loglinear_cli::tasks::{IGNORE, MqarConfig, MqarLayout};
    /// let cfg = MqarConfig { layout: MqarLayout::Seed, ..MqarConfig::new(16, 12, 2) };
    /// let ex = &cfg.generate(1, 3).unwrap()[0];
    /// println!("{ex}");
    /// assert_eq!(ex.inputs, [4, 14, 1, 10, 11, 7, 10, 4, 1, 3, 4, 7]);
    /// let scored: Vec<usize> = (0..12).filter(|&p| ex.targets[p] != IGNORE).collect();
    /// assert_eq!(scored, [8, 10]);
    /// for &p in &scored {
    ///     let j = (0..2).find(|&j| ex.inputs[2 * j] == ex.inputs[p]).unwrap();
    ///     assert_eq!(ex.targets[p], ex.inputs[2 * j + 1] as i64);
    /// }
    /// assert!(ex.inputs.iter().all(|&x| x != 0)); // the filler is never 0 in the seed layout
    /// ```
    ///
    /// With V = 128, T = 128, K = 32 (the fork's hardest setting) the seed layout has no filler at
    /// all: positions 0..63 are the key-value pairs and 64..127 the queries and their answer slots.
    pub fn generate(&self, n: usize, seed: u64) -> Result<Vec<Example>, TaskError> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(seed);
        Ok((0..n).map(|_| self.sample(&mut rng)).collect())
    }

    /// One example from `rng`; the config must be valid.
    fn sample(&self, rng: &mut StdRng) -> Example {
        let (v, t, k) = (self.vocab_size, self.seq_len, self.num_kv_pairs);
        let half = v / 2;
        // Permutation prefixes, as numpy's choice(replace=False): distinct and in random order.
        let keys: Vec<u32> = index::sample(rng, half - 1, k)
            .into_iter()
            .map(|i| (1 + i) as u32)
            .collect();
        let values: Vec<u32> = index::sample(rng, v - half, k)
            .into_iter()
            .map(|i| (half + i) as u32)
            .collect();

        let mut inputs = vec![0u32; t];
        let mut targets = vec![IGNORE; t];
        for j in 0..k {
            inputs[2 * j] = keys[j];
            inputs[2 * j + 1] = values[j];
        }
        // Zoology: query j goes to position 2K + 2·gap_j. Filler: the tokens that replace a 0.
        let (gaps, filler): (Vec<usize>, Range<u32>) = match self.layout {
            MqarLayout::Zoology => {
                let space = (t - 2 * k) / 2;
                let a = self.power_a;
                // Successive weighted sampling without replacement (Efraimidis–Spirakis), the same
                // distribution as numpy's choice(space, K, replace=False, p).
                let gaps =
                    index::sample_weighted(rng, space, |i| a * ((i + 1) as f64).powf(a - 1.0), k)
                        .expect("power-law weights are finite and positive");
                (gaps.into_iter().collect(), 0..v as u32)
            }
            MqarLayout::Seed => {
                let q_start = t - 2 * k;
                // Each key is asked once, in a random order, at the even offsets of the block.
                let order = index::sample(rng, k, k).into_vec();
                for (i, &j) in order.iter().enumerate() {
                    inputs[q_start + 2 * i] = keys[j];
                    targets[q_start + 2 * i] = i64::from(values[j]);
                }
                (Vec::new(), 1..v as u32)
            }
        };
        for (j, &gap) in gaps.iter().enumerate() {
            let p = 2 * k + 2 * gap;
            inputs[p] = keys[j];
            targets[p] = i64::from(values[j]);
        }
        if self.random_non_queries {
            for x in inputs[2 * k..].iter_mut().filter(|x| **x == 0) {
                *x = rng.random_range(filler.clone());
            }
        }
        Example { inputs, targets }
    }

    /// Named position ranges. Zoology: `"context"` 0..2K, `"query region"` 2K..T. Seed:
    /// `"key-value pairs"` 0..2K, `"filler"` 2K..T−2K (absent when empty, e.g. K = 32, T = 128),
    /// `"queries"` T−2K..T.
    pub fn regions(&self) -> Vec<Region> {
        let (t, c) = (self.seq_len, 2 * self.num_kv_pairs);
        match self.layout {
            MqarLayout::Zoology => vec![
                Region::new("context", 0..c),
                Region::new("query region", c..t),
            ],
            MqarLayout::Seed => {
                let q = t.saturating_sub(c);
                let mut r = vec![Region::new("key-value pairs", 0..c)];
                if q > c {
                    r.push(Region::new("filler", c..q));
                }
                r.push(Region::new("queries", q..t));
                r
            }
        }
    }

    /// E.g. `"mqar(zoology, V=8192, T=256, K=16)"`; a non-default `power_a` or zero filler is
    /// appended (`", a=0.1"`, `", zero filler"`).
    pub fn name(&self) -> String {
        let layout = match self.layout {
            MqarLayout::Zoology => "zoology",
            MqarLayout::Seed => "seed",
        };
        let mut s = format!(
            "mqar({layout}, V={}, T={}, K={}",
            self.vocab_size, self.seq_len, self.num_kv_pairs
        );
        if self.power_a != DEFAULT_POWER_A {
            s += &format!(", a={}", self.power_a);
        }
        if !self.random_non_queries {
            s += ", zero filler";
        }
        s + ")"
    }
}
