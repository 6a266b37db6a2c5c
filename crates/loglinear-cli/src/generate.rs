//! Text generation: prefill the prompt with the chunked form, then decode token by token with
//! the O(log T) Fenwick cache (or the Transformer's KV cache).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use burn::tensor::TensorData;
use loglinear::nn::{ModelState, TransformerState};
use rand::{Rng, SeedableRng};

use crate::checkpoint;
use crate::config::{ConfigFile, ExperimentConfig};
use crate::data::Gpt2Tokenizer;
use crate::model::Model;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 = greedy (argmax).
    pub temperature: f64,
    /// Keep the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `p` (1 = all).
    pub top_p: f64,
}

impl Sampling {
    /// Argmax decoding.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    /// The sampling of `loglinear generate`'s flags, each checked against its meaningful range
    /// (the error names the flag): `--temperature` ≥ 0 (0 = greedy), `--top-k` ≥ 1 when given
    /// (absent = every token), `--top-p` in (0, 1].
    pub fn from_flags(temperature: f64, top_k: Option<usize>, top_p: f64) -> Result<Sampling> {
        if !(temperature >= 0.0 && temperature.is_finite()) {
            bail!("--temperature must be ≥ 0 (0 = greedy), got {temperature}");
        }
        if top_k == Some(0) {
            bail!("--top-k must be at least 1 (leave it out to keep every token), got 0");
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            bail!("--top-p is a probability in (0, 1] (1 = every token), got {top_p}");
        }
        Ok(Sampling {
            temperature,
            top_k: top_k.unwrap_or(0),
            top_p,
        })
    }

    /// Chooses a token from logits (host values).
    pub fn pick(&self, logits: &[f64], rng: &mut impl Rng) -> u32 {
        let argmax = || {
            logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i as u32)
        };
        if self.temperature <= 0.0 {
            return argmax();
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if self.top_k > 0 {
            order.truncate(self.top_k);
        }
        let max = logits[order[0]];
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] - max) / self.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = order.len();
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            for (j, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= self.top_p {
                    keep = j + 1;
                    break;
                }
            }
        }
        let kept: f64 = weights[..keep].iter().sum();
        let mut u = rng.random::<f64>() * kept;
        for (j, w) in weights[..keep].iter().enumerate() {
            u -= w;
            if u <= 0.0 {
                return order[j] as u32;
            }
        }
        order[keep - 1] as u32
    }
}

/// A decoding cache of either model kind.
pub enum Cache {
    /// Log-linear Mamba-2: conv windows and Fenwick states, O(log T).
    LogLinear(ModelState),
    /// Transformer: keys and values of every position, O(T).
    Transformer(TransformerState),
}

impl Cache {
    /// Bytes the cache holds on the device.
    pub fn size_bytes(&self) -> usize {
        match self {
            Cache::LogLinear(s) => s.size_bytes(),
            Cache::Transformer(s) => s.size_bytes(),
        }
    }
}

/// Runs the prompt (`[1, T]`) and returns the last position's logits and the cache.
pub fn prefill(
    model: &Model,
    prompt: &[u32],
    chunk: usize,
    device: &Device,
) -> Result<(Vec<f64>, Cache)> {
    let ids: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    let t = ids.len();
    if t == 0 {
        bail!("the prompt is empty: give at least one token of text");
    }
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, vec![1, t]), device);
    let (logits, cache) = match model {
        Model::Mamba2(m) => {
            let (l, s) = m.prefill(tokens, chunk);
            (l, Cache::LogLinear(s))
        }
        Model::Transformer(m) => {
            let (l, s) = m.prefill(tokens);
            (l, Cache::Transformer(s))
        }
        Model::PaperSynthetic(_) => bail!(
            "the paper_synthetic model has no decoding cache; generate with a mamba2 or transformer run"
        ),
    };
    Ok((last_row(logits.narrow(1, t - 1, 1).squeeze_dim(1)), cache))
}

/// One decoding step: the next position's logits.
pub fn step(model: &Model, token: u32, cache: &mut Cache, device: &Device) -> Vec<f64> {
    let token = Tensor::<1, Int>::from_data(TensorData::new(vec![token as i64], vec![1]), device);
    let logits = match (model, cache) {
        (Model::Mamba2(m), Cache::LogLinear(s)) => m.step(token, s),
        (Model::Transformer(m), Cache::Transformer(s)) => m.step(token, s),
        _ => unreachable!("a cache of the model's own kind"),
    };
    last_row(logits)
}

fn last_row(logits: Tensor<2>) -> Vec<f64> {
    loglinear::host::to_f64(&logits)
}

/// Logits of the last position by running the whole sequence again (no cache).
pub fn recompute(
    model: &Model,
    tokens: &[u32],
    form: loglinear::Form,
    device: &Device,
) -> Vec<f64> {
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let t = ids.len();
    let x = Tensor::<2, Int>::from_data(TensorData::new(ids, vec![1, t]), device);
    let logits = model.forward(x, form, false).logits.logits();
    last_row(logits.narrow(1, t - 1, 1).squeeze_dim::<2>(1))
}

/// Generates `n` tokens after `prompt`; calls `emit` with each new token as it is produced.
#[allow(clippy::too_many_arguments)] // each is a separate choice of the `generate` command
pub fn generate(
    model: &Model,
    prompt: &[u32],
    n: usize,
    sampling: Sampling,
    seed: u64,
    chunk: usize,
    device: &Device,
    mut emit: impl FnMut(u32),
) -> Result<(Vec<u32>, Cache)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut logits, mut cache) = prefill(model, prompt, chunk, device)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let token = sampling.pick(&logits, &mut rng);
        out.push(token);
        emit(token);
        if i + 1 < n {
            logits = step(model, token, &mut cache, device);
        }
    }
    Ok((out, cache))
}

/// Options of `loglinear generate`.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Prompt text.
    pub prompt: String,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: Sampling,
    /// Sampling seed.
    pub seed: u64,
}

/// `loglinear generate`: prints the text as it is produced, then tokens/s and cache bytes.
pub fn run(run_dir: &Path, opts: &GenerateOptions, device: &Device) -> Result<()> {
    let file = ConfigFile::load(&run_dir.join("config.toml"), &[])
        .with_context(|| format!("{} is not a run directory", run_dir.display()))?;
    let config: ExperimentConfig = file.config()?;
    if !config.task.is_lm() {
        bail!(
            "{} is not a language-model run (task {})",
            run_dir.display(),
            config.task.name()
        );
    }
    let mut model = Model::new(&config, device);
    checkpoint::load_run_model(run_dir, &mut model)?;
    let tokenizer = Gpt2Tokenizer::new();
    let prompt = tokenizer.encode(&opts.prompt);
    let mut printed = String::new();
    let mut generated: Vec<u32> = Vec::new();
    print!("{}", opts.prompt);
    std::io::stdout().flush().ok();
    let start = Instant::now();
    let (_, cache) = generate(
        &model,
        &prompt,
        opts.max_tokens,
        opts.sampling,
        opts.seed,
        config.model.chunk(),
        device,
        |t| {
            generated.push(t);
            // Decode everything so far and print what is new (a token can end mid-character).
            let text = tokenizer.decode(&generated);
            if text.len() > printed.len()
                && text.is_char_boundary(printed.len())
                && !text.ends_with('\u{FFFD}')
            {
                print!("{}", &text[printed.len()..]);
                std::io::stdout().flush().ok();
                printed = text;
            }
        },
    )?;
    let secs = start.elapsed().as_secs_f64();
    let text = tokenizer.decode(&generated);
    if text.len() > printed.len() && text.is_char_boundary(printed.len()) {
        print!("{}", &text[printed.len()..]);
    }
    println!();
    std::io::stdout().flush().ok();
    eprintln!(
        "{} prompt tokens, {} generated in {:.2} s ({:.1} tokens/s, prefill included); cache {} bytes at position {}",
        prompt.len(),
        generated.len(),
        secs,
        generated.len() as f64 / secs.max(1e-9),
        cache.size_bytes(),
        prompt.len() + generated.len().saturating_sub(1)
    );
    Ok(())
}
