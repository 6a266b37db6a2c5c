//! The softmax-attention baseline of the language-modelling runs (spec §7.2.5): a GPT-2
//! (HF `GPT2LMHeadModel`) causal Transformer: token + learned position embeddings → N ×
//! [LayerNorm → causal multi-head attention → residual → LayerNorm → GELU MLP → residual] →
//! LayerNorm → LM head (tied to the token embedding by default); with prefill and decoding
//! through a key/value cache.
//!
//! The cache of every block holds the keys and values of all tokens seen so far, so the
//! decoding state grows linearly with the position (compare [`super::ModelState`], whose
//! Fenwick levels grow as O(log T)).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::gelu_approximate;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::check::{ConfigError, positive, std_dev, width_when_set};
use super::init::{Dense, Init, LayerNorm, PaddedLogits, Precision, to_dtype};

/// Configuration of the GPT-2 baseline (field names follow `GPT2Config` where they map); the
/// defaults are GPT-2's (1024 positions, MLP width 4·D, tied head, eps 1e-5, init std 0.02).
/// Spec §7.2.5 uses D = 256 with H = 4 or D = 512 with H = 8, 6 layers.
#[derive(Config, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Vocabulary size (`vocab_size`; 50257 for the GPT-2 tokenizer).
    pub vocab_size: usize,
    /// Model width `D` (`n_embd`).
    pub d_model: usize,
    /// Number of blocks (`n_layer`).
    pub n_layers: usize,
    /// Attention heads `H` (`n_head`); `head_dim = D / H`.
    pub n_heads: usize,
    /// Rows of the position embedding (`n_positions`): the longest sequence the model reads.
    #[config(default = 1024)]
    pub max_seq_len: usize,
    /// MLP width (`n_inner`); `None` = `4·D`.
    pub mlp_width: Option<usize>,
    /// Share the token embedding with the LM head (GPT-2 does).
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// Epsilon of every LayerNorm (`layer_norm_epsilon`).
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Standard deviation of the normal init (`initializer_range`).
    #[config(default = 0.02)]
    pub initializer_range: f64,
    /// Compute dtype (mixed precision); parameters stay f32.
    #[config(default = "Precision::Full")]
    pub precision: Precision,
}

impl TransformerConfig {
    /// `D / H`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// MLP width: the configured one or `4·D`.
    pub fn mlp_width(&self) -> usize {
        self.mlp_width.unwrap_or(4 * self.d_model)
    }

    /// Checks the sizes and that they fit together, naming the field that does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive(&[
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("max_seq_len", self.max_seq_len),
        ])?;
        width_when_set("mlp_width", self.mlp_width)?;
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(ConfigError::new(
                "n_heads",
                format!("({}) must divide d_model = {}", self.n_heads, self.d_model),
            ));
        }
        std_dev("initializer_range", self.initializer_range)
    }

    /// Builds the model with the init of HF GPT-2 (`_init_weights`), drawing every parameter
    /// from `seed`: embeddings and linear weights `N(0, std²)`, biases 0, LayerNorms (1, 0), and
    /// the two residual projections of every block (attention out, MLP down) `N(0, (std/√(2·N))²)`.
    ///
    /// # Panics
    /// If [`TransformerConfig::validate`] fails.
    pub fn init(&self, seed: u64, device: &Device) -> TransformerLm {
        if let Err(e) = self.validate() {
            panic!("TransformerLm: {e}");
        }
        let mut init = Init::new(seed, device);
        let (v, d, w, std) = (
            self.vocab_size,
            self.d_model,
            self.mlp_width(),
            self.initializer_range,
        );
        let out_std = std / (2.0 * self.n_layers as f64).sqrt();
        let token_embedding = init.normal([v, d], std);
        let position_embedding = init.normal([self.max_seq_len, d], std);
        let blocks = (0..self.n_layers)
            .map(|_| TransformerBlock {
                attn_norm: LayerNorm::new(&mut init, d, self.norm_eps),
                attn: CausalSelfAttention {
                    qkv: Affine::normal(&mut init, d, 3 * d, std),
                    out: Affine::normal(&mut init, d, d, out_std),
                    n_heads: self.n_heads,
                },
                mlp_norm: LayerNorm::new(&mut init, d, self.norm_eps),
                mlp: GeluMlp {
                    up: Affine::normal(&mut init, d, w, std),
                    down: Affine::normal(&mut init, w, d, out_std),
                },
            })
            .collect();
        let norm = LayerNorm::new(&mut init, d, self.norm_eps);
        let head = (!self.tie_embeddings).then(|| Dense::normal(&mut init, d, v, std));
        TransformerLm {
            token_embedding,
            position_embedding,
            blocks,
            norm,
            head,
            config: self.clone(),
        }
    }
}

/// A linear map with bias, `y = x W + b` (GPT-2's `Conv1D`, which also stores `W` as
/// `[d_in, d_out]`).
#[derive(Module, Debug)]
pub struct Affine {
    /// `W: [d_in, d_out]`.
    pub linear: Dense,
    /// `b: [d_out]`, initialised to 0.
    pub bias: Param<Tensor<1>>,
}

impl Affine {
    /// `N(0, std²)` weights, zero bias.
    pub fn normal(init: &mut Init, d_in: usize, d_out: usize, std: f64) -> Self {
        Self {
            linear: Dense::normal(init, d_in, d_out, std),
            bias: init.constant([d_out], 0.0),
        }
    }

    /// # Shapes
    /// `x: [..., d_in]` → `[..., d_out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let weight = to_dtype(self.linear.weight.val(), dtype);
        super::init::add_bias(crate::linalg::linear(x, weight), self.bias.val())
    }
}

/// Keys and values of the tokens one attention layer has seen.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// `[B, H, t, head_dim]`.
    pub keys: Tensor<4>,
    /// `[B, H, t, head_dim]`.
    pub values: Tensor<4>,
}

impl KvCache {
    /// Tokens held.
    pub fn len(&self) -> usize {
        self.keys.dims()[2]
    }

    /// Whether no token is held (never true for a cache built by [`CausalSelfAttention`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held on the device.
    pub fn size_bytes(&self) -> usize {
        let bytes = |x: &Tensor<4>| x.shape().num_elements() * x.dtype().size();
        bytes(&self.keys) + bytes(&self.values)
    }
}

/// Causal multi-head softmax self-attention with a fused `q | k | v` projection:
/// `softmax(q kᵀ / √head_dim + causal mask) v`, heads concatenated, then the output projection.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// `D → q | k | v` (`c_attn`); within each of the three, head `h` owns columns
    /// `h·head_dim .. (h+1)·head_dim`.
    pub qkv: Affine,
    /// `D → D` (`c_proj`), a residual projection.
    pub out: Affine,
    /// Heads `H`.
    #[module(skip)]
    pub n_heads: usize,
}

impl CausalSelfAttention {
    /// Attention over a whole sequence, each position seeing itself and the ones before it.
    ///
    /// # Shapes
    /// `x: [B, T, D]` → `[B, T, D]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.extend(x, &mut None)
    }

    /// Attention for the tokens `x` that follow those whose keys and values are in `cache`
    /// (none when `None`); appends the keys and values of `x` to the cache.
    ///
    /// # Shapes
    /// `x: [B, T, D]` → `[B, T, D]`; `cache`: `[B, H, t, head_dim]` → `[B, H, t + T, head_dim]`.
    pub fn extend(&self, x: Tensor<3>, cache: &mut Option<KvCache>) -> Tensor<3> {
        let [b, t, d] = x.dims();
        let (h, hd) = (self.n_heads, d / self.n_heads);
        let qkv = self.qkv.forward(x); // [B, T, 3D]
        let split = |i: usize| {
            qkv.clone()
                .narrow(2, i * d, d)
                .reshape([b, t, h, hd]) // [B, T, H, hd]
                .swap_dims(1, 2) // [B, H, T, hd]
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let (keys, values) = match cache.take() {
            Some(c) => {
                assert_eq!(
                    c.keys.dims()[0],
                    b,
                    "CausalSelfAttention: cache holds batch {}, input has batch {b}",
                    c.keys.dims()[0]
                );
                (
                    Tensor::cat(vec![c.keys, k], 2),
                    Tensor::cat(vec![c.values, v], 2),
                )
            }
            None => (k, v),
        };
        let past = keys.dims()[2] - t;
        let o = Self::attend(q, keys.clone(), values.clone(), past); // [B, H, T, hd]
        *cache = Some(KvCache { keys, values });
        self.out.forward(o.swap_dims(1, 2).reshape([b, t, d]))
    }

    /// `softmax(q kᵀ / √head_dim + causal mask) v` with query `i` at position `past + i` seeing
    /// keys `0 ..= past + i`. Up to `ATTENTION_BLOCK` queries, where the device's tensor cores
    /// take the inputs (bf16, a head width of 16, 32, 64 or 128), it is the fused
    /// FlashAttention kernels ([`crate::kernels::flash_attention`]: no score in device memory;
    /// beyond a block of queries they are slower than the blocks below). Elsewhere on CubeCL
    /// devices the two products run on [`crate::linalg::matmul`] (cuBLAS on CUDA) and the softmax
    /// is one kernel each way ([`crate::kernels::attention`]; Burn's attention under autodiff is a
    /// dozen separate ops over the `[B, H, T, T]` scores); beyond `ATTENTION_BLOCK` queries the
    /// same in blocks of queries with the probabilities recomputed in the backward
    /// ([`crate::kernels::block_attention`]); on other devices it is Burn's `attention`.
    ///
    /// # Shapes
    /// `q: [B, H, T, hd]`, `keys, values: [B, H, past + T, hd]` → `[B, H, T, hd]`.
    fn attend(q: Tensor<4>, keys: Tensor<4>, values: Tensor<4>, past: usize) -> Tensor<4> {
        let [b, h, t, _] = q.dims();
        #[cfg(feature = "kernels")]
        if crate::kernels::is_cube_device(&q.device()) {
            use crate::kernels::block_attention::ATTENTION_BLOCK;
            use crate::linalg::matmul;
            let [hd, s] = [q.dims()[3], keys.dims()[2]];
            let scale = (hd as f32).powf(-0.5);
            // Measured on the H200 (bench/RESULTS.md, session 14): the flash kernels tie the
            // scores path at T = 512 × 64 (10.0 against ≈ 8.4 ms of products and softmax, the
            // step 40.4 ms) but lose beyond a block of queries (T = 8192 × 4: 124.7 ms of flash
            // kernels against ≈ 83 ms blockwise; 32,768: 479 against ≈ 365), so they take the
            // short sequences only.
            if t <= ATTENTION_BLOCK
                && crate::kernels::flash_attention_on_tensor_cores(&q)
                && let Some(o) =
                    crate::kernels::causal_flash_attention(&q, &keys, &values, scale, past, 0)
            {
                return o;
            }
            if t > ATTENTION_BLOCK {
                // Long sequences: blocks of queries, probabilities recomputed in the backward
                // (no [B, H, T, T] tensor kept per layer).
                let flat = |x: Tensor<4>, rows| x.reshape([b * h, rows, hd]);
                let o = crate::kernels::causal_block_attention(
                    &flat(q.clone(), t),
                    &flat(keys.clone(), s),
                    &flat(values.clone(), s),
                    scale,
                    past,
                    ATTENTION_BLOCK,
                );
                if let Some(o) = o {
                    return o.reshape([b, h, t, hd]);
                }
            }
            let scores = matmul(q.clone(), keys.clone().swap_dims(2, 3)); // [B, H, T, past + T]
            if let Some(probs) = crate::kernels::attention_softmax(&scores, scale, past) {
                return matmul(probs, values);
            }
        }
        // Query i sits at position past + i and sees keys 0..=past + i. A square problem uses
        // the backend's causal mode; a chunk after a cache gets the explicit mask (kernels differ
        // in how they align `is_causal` when there are more keys than queries); one query sees
        // every key.
        let (mask, is_causal) = match (past, t) {
            (0, _) => (None, t > 1),
            (_, 1) => (None, false),
            _ => {
                let mask = Tensor::<2, Bool>::tril_mask([t, past + t], past as i64, &q.device());
                (
                    Some(mask.unsqueeze::<4>().expand([b, h, t, past + t])),
                    false,
                )
            }
        };
        let options = AttentionModuleOptions {
            is_causal,
            ..Default::default()
        };
        attention(q, keys, values, mask, None, options)
    }
}

/// `W_down · gelu_tanh(W_up x + b_up) + b_down` (GPT-2's MLP with `gelu_new`).
#[derive(Module, Debug)]
pub struct GeluMlp {
    /// `D → W` (`c_fc`).
    pub up: Affine,
    /// `W → D` (`c_proj`), a residual projection.
    pub down: Affine,
}

impl GeluMlp {
    /// # Shapes
    /// `x: [B, T, D]` → `[B, T, D]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.down.forward(gelu_approximate(self.up.forward(x)))
    }
}

/// One pre-LayerNorm residual block.
#[derive(Module, Debug)]
pub struct TransformerBlock {
    /// Norm before attention (`ln_1`).
    pub attn_norm: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Norm before the MLP (`ln_2`).
    pub mlp_norm: LayerNorm,
    /// The MLP.
    pub mlp: GeluMlp,
}

impl TransformerBlock {
    /// # Shapes
    /// `x: [B, T, D]` → `[B, T, D]`.
    fn extend(&self, x: Tensor<3>, cache: &mut Option<KvCache>) -> Tensor<3> {
        let r = x.clone() + self.attn.extend(self.attn_norm.forward(x), cache);
        r.clone() + self.mlp.forward(self.mlp_norm.forward(r))
    }
}

/// Decoding state: the key/value cache of every block. Its size grows linearly with the
/// number of tokens absorbed.
#[derive(Clone, Debug)]
pub struct TransformerState {
    /// Per block; `None` before the first token.
    pub layers: Vec<Option<KvCache>>,
    /// Batch size.
    pub batch: usize,
    /// Tokens absorbed so far.
    pub position: usize,
}

impl TransformerState {
    /// Tokens absorbed so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes held on the device (keys and values of every block):
    /// `2 · layers · B · t · D · bytes per element`.
    pub fn size_bytes(&self) -> usize {
        self.layers.iter().flatten().map(KvCache::size_bytes).sum()
    }
}

/// The GPT-2 softmax-attention language model.
#[derive(Module, Debug)]
pub struct TransformerLm {
    /// Token embedding `[V, D]` (`wte`), also the LM head when tied.
    pub token_embedding: Param<Tensor<2>>,
    /// Position embedding `[max_seq_len, D]` (`wpe`).
    pub position_embedding: Param<Tensor<2>>,
    /// The blocks.
    pub blocks: Vec<TransformerBlock>,
    /// Final norm (`ln_f`).
    pub norm: LayerNorm,
    /// LM head without bias (`None` when tied to the token embedding).
    pub head: Option<Dense>,
    /// Configuration.
    #[module(skip)]
    pub config: TransformerConfig,
}

impl TransformerLm {
    /// Logits of every position of a sequence that starts at position 0.
    ///
    /// # Panics
    /// If `T > max_seq_len`.
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn run(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.run_padded(tokens).logits()
    }

    /// [`TransformerLm::run`] with the head's output over the padded vocabulary, for the loss
    /// ([`PaddedLogits`]).
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V']`.
    pub fn run_padded(&self, tokens: Tensor<2, Int>) -> PaddedLogits {
        let b = tokens.dims()[0];
        let mut state = self.init_state(b, &tokens.device());
        let h = self.hidden(tokens, &mut state);
        self.head(h)
    }

    /// Same as [`TransformerLm::run`] (the name [`super::LogLinearLm`] uses).
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.run(tokens)
    }

    /// Runs the prompt and returns its logits and the key/value cache of its tokens.
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn prefill(&self, tokens: Tensor<2, Int>) -> (Tensor<3>, TransformerState) {
        let b = tokens.dims()[0];
        let mut state = self.init_state(b, &tokens.device());
        let logits = self.extend(tokens, &mut state);
        (logits, state)
    }

    /// An empty decoding state for a batch of `b` (the cache is allocated by the first token,
    /// so `device` is unused; the signature mirrors [`super::LogLinearLm::init_state`]).
    pub fn init_state(&self, b: usize, _device: &Device) -> TransformerState {
        TransformerState {
            layers: vec![None; self.blocks.len()],
            batch: b,
            position: 0,
        }
    }

    /// One decoding step: attends over the cache, which grows by one token per block (O(t)
    /// memory and time at position t).
    ///
    /// # Panics
    /// If the state is already at `max_seq_len`.
    ///
    /// # Shapes
    /// `token: [B]` → logits `[B, V]`.
    pub fn step(&self, token: Tensor<1, Int>, state: &mut TransformerState) -> Tensor<2> {
        self.extend(token.unsqueeze_dim(1), state).squeeze_dim(1)
    }

    /// Logits of `tokens`, which follow the ones absorbed by `state`; appends them to the cache.
    ///
    /// # Panics
    /// If the batch differs from the state's, or the sequence would run past `max_seq_len`.
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn extend(&self, tokens: Tensor<2, Int>, state: &mut TransformerState) -> Tensor<3> {
        let h = self.hidden(tokens, state);
        self.head(h).logits()
    }

    /// The last block's output `[B, T, D]` for `tokens` after those in `state`, which it extends.
    fn hidden(&self, tokens: Tensor<2, Int>, state: &mut TransformerState) -> Tensor<3> {
        let [b, t] = tokens.dims();
        let (start, max) = (state.position, self.config.max_seq_len);
        assert!(
            start + t <= max,
            "TransformerLm: a sequence of {} tokens (positions {start}..{}) is longer than \
             max_seq_len = {max}",
            start + t,
            start + t
        );
        assert_eq!(
            b, state.batch,
            "TransformerLm: tokens have batch {b}, the decoding state batch {}",
            state.batch
        );
        let table = self.token_embedding.val();
        let dtype = self.config.precision.compute_dtype(table.dtype());
        let positions = self.position_embedding.val().narrow(0, start, t); // [T, D]
        let h = super::init::embed(table, tokens) + positions.unsqueeze::<3>(); // [B, T, D]
        let mut h = to_dtype(h, dtype);
        for (block, cache) in self.blocks.iter().zip(&mut state.layers) {
            h = block.extend(h, cache);
        }
        state.position += t;
        h
    }

    /// The head's logits in the compute dtype (bf16 under mixed precision), over the padded
    /// vocabulary: the loss reads them as they are and computes in f32. A cast to f32 would
    /// write and read the `[B, T, V]` logits twice more per step, forward and backward, for the
    /// same values (bench/RESULTS.md, session 9).
    fn head(&self, h: Tensor<3>) -> PaddedLogits {
        let h = self.norm.forward(h);
        match &self.head {
            Some(head) => super::init::vocab_logits(h, head.weight.val(), false),
            None => super::init::vocab_logits(h, self.token_embedding.val(), true),
        }
    }
}
