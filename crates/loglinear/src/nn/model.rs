//! The log-linear language model (spec §2.4): embedding → N × [RMSNorm → mixer → residual →
//! RMSNorm → GatedMLP → residual] → RMSNorm → LM head; with prefill and decoding. The mixer is
//! log-linear Mamba-2 (spec §2.3) or log-linear Gated DeltaNet (spec §5.1).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::activation::silu;

use super::check::{ConfigError, positive, std_dev, width_when_set};
use super::gdn_mixer::{GdnConfig, LogLinearGatedDeltaNet};
use super::init::{Dense, Init, PaddedLogits, Precision, RmsNorm, to_dtype};
use super::mixer::{LogLinearMamba2, MixerConfig, MixerKind, MixerOutput, MixerState};
use crate::ops::Form;

/// Language-model configuration.
#[derive(Config, Debug, PartialEq)]
pub struct LmConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Number of blocks.
    pub n_layers: usize,
    /// The Mamba-2 mixer of every block (its `d_model` is the model width).
    pub mixer: MixerConfig,
    /// When set, every block mixes with log-linear Gated DeltaNet instead of `mixer` (whose
    /// `d_model` still gives the model width, and must equal this one's).
    #[config(default = "None")]
    pub gdn: Option<GdnConfig>,
    /// GatedMLP width; `None` = `256·⌈int(8·D/3)/256⌉` (spec §2.4).
    pub mlp_width: Option<usize>,
    /// Share the embedding matrix with the LM head.
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Epsilon of the block and final RMSNorms.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Standard deviation of the normal init of embeddings and projections.
    #[config(default = 0.02)]
    pub initializer_range: f64,
    /// Compute dtype (mixed precision); parameters stay f32.
    #[config(default = "Precision::Full")]
    pub precision: Precision,
}

impl LmConfig {
    /// Model width.
    pub fn d_model(&self) -> usize {
        self.mixer.d_model
    }

    /// Which mixer the blocks use.
    pub fn mixer_kind(&self) -> MixerKind {
        if self.gdn.is_some() {
            MixerKind::GatedDeltaNet
        } else {
            MixerKind::Mamba2
        }
    }

    /// The λ of the blocks' mixer.
    pub fn lambda(&self) -> &super::LambdaConfig {
        match &self.gdn {
            Some(g) => &g.lambda,
            None => &self.mixer.lambda,
        }
    }

    /// Parameters of the model, counted without allocating (equals `init(..).num_params()`).
    pub fn num_params(&self) -> usize {
        let (v, d, w) = (self.vocab_size, self.d_model(), self.mlp_width());
        let mixer = match &self.gdn {
            Some(g) => g.num_params(),
            None => self.mixer.num_params(),
        };
        // Per block: two norms, the mixer, the GatedMLP; then the final norm, embedding, head.
        let block = 2 * d + mixer + 3 * d * w;
        let head = if self.tie_embeddings { 0 } else { d * v };
        self.n_layers * block + d + v * d + head
    }

    /// GatedMLP width: the configured one or `256·⌈int(D·4·2/3)/256⌉`.
    pub fn mlp_width(&self) -> usize {
        self.mlp_width
            .unwrap_or_else(|| (self.d_model() * 8 / 3).div_ceil(256) * 256)
    }

    /// Checks the sizes, naming the field that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive(&[("vocab_size", self.vocab_size), ("n_layers", self.n_layers)])?;
        match &self.gdn {
            // The Mamba-2 mixer's other fields are not read when Gated DeltaNet mixes.
            Some(g) => {
                g.validate().map_err(|e| e.within("gdn"))?;
                if g.d_model != self.mixer.d_model {
                    return Err(ConfigError::new(
                        "gdn.d_model",
                        format!(
                            "({}) must equal the model width mixer.d_model = {}",
                            g.d_model, self.mixer.d_model
                        ),
                    ));
                }
                positive(&[("mixer.d_model", self.mixer.d_model)])?;
            }
            None => self.mixer.validate().map_err(|e| e.within("mixer"))?,
        }
        width_when_set("mlp_width", self.mlp_width)?;
        std_dev("initializer_range", self.initializer_range)
    }

    /// Builds the model with the init of spec §2.5, drawing every parameter from `seed`.
    ///
    /// # Panics
    /// If [`LmConfig::validate`] fails.
    pub fn init(&self, seed: u64, device: &Device) -> LogLinearLm {
        if let Err(e) = self.validate() {
            panic!("LogLinearLm: {e}");
        }
        let mut init = Init::new(seed, device);
        let (v, d, std) = (self.vocab_size, self.d_model(), self.initializer_range);
        // rescale_prenorm_residual: out_proj and down_proj are kaiming-uniform / √(2·layers).
        let out_scale = 1.0 / (2.0 * self.n_layers as f64).sqrt();
        let embedding = init.normal([v, d], std);
        let blocks = (0..self.n_layers)
            .map(|_| Block {
                mixer_norm: RmsNorm::new(&mut init, d, self.norm_eps),
                mixer: self
                    .gdn
                    .is_none()
                    .then(|| self.mixer.init(&mut init, std, out_scale)),
                gdn: self.gdn.as_ref().map(|g| g.init(&mut init, std, out_scale)),
                mlp_norm: RmsNorm::new(&mut init, d, self.norm_eps),
                mlp: GatedMlp::new(&mut init, d, self.mlp_width(), std, out_scale),
            })
            .collect();
        let norm = RmsNorm::new(&mut init, d, self.norm_eps);
        let head = (!self.tie_embeddings).then(|| Dense::normal(&mut init, d, v, std));
        LogLinearLm {
            embedding,
            blocks,
            norm,
            head,
            config: self.clone(),
        }
    }
}

/// `W_down · (silu(W_gate x) ⊙ W_up x)`, no biases.
#[derive(Module, Debug)]
pub struct GatedMlp {
    /// `D → W`.
    pub gate: Dense,
    /// `D → W`.
    pub up: Dense,
    /// `W → D`.
    pub down: Dense,
}

impl GatedMlp {
    fn new(init: &mut Init, d: usize, width: usize, std: f64, out_scale: f64) -> Self {
        Self {
            gate: Dense::normal(init, d, width, std),
            up: Dense::normal(init, d, width, std),
            down: Dense::kaiming_uniform(init, width, d, out_scale),
        }
    }

    /// # Shapes
    /// `x: [B, T, D]` → `[B, T, D]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.down
            .forward(silu(self.gate.forward(x.clone())) * self.up.forward(x))
    }
}

/// One pre-norm residual block. Exactly one of `mixer` and `gdn` is set. (Two optional fields
/// rather than an enum: an enum module adds its variant to every tensor's name, and the
/// checkpoints of Mamba-2 runs written before Gated DeltaNet existed name theirs
/// `blocks.N.mixer.…`.)
#[derive(Module, Debug)]
pub struct Block {
    /// Norm before the mixer.
    pub mixer_norm: RmsNorm,
    /// The log-linear Mamba-2 mixer.
    pub mixer: Option<LogLinearMamba2>,
    /// The log-linear Gated DeltaNet mixer.
    pub gdn: Option<LogLinearGatedDeltaNet>,
    /// Norm before the MLP.
    pub mlp_norm: RmsNorm,
    /// The GatedMLP.
    pub mlp: GatedMlp,
}

impl Block {
    /// The mixer's forward (see [`LogLinearMamba2::forward`]).
    fn mix(
        &self,
        x: Tensor<3>,
        form: Form,
        state: Option<&MixerState>,
        return_state: bool,
    ) -> MixerOutput {
        match (&self.mixer, &self.gdn) {
            (Some(m), None) => m.forward(x, form, state, return_state),
            (None, Some(g)) => g.forward(x, form, state, return_state),
            _ => panic!("Block: exactly one of mixer and gdn must be set"),
        }
    }

    /// The mixer's decoding step.
    fn mix_step(&self, x: Tensor<2>, state: &mut MixerState) -> Tensor<2> {
        match (&self.mixer, &self.gdn) {
            (Some(m), None) => m.step(x, state),
            (None, Some(g)) => g.step(x, state),
            _ => panic!("Block: exactly one of mixer and gdn must be set"),
        }
    }

    /// An empty decoding state of the mixer.
    fn init_state(&self, b: usize, device: &Device) -> MixerState {
        match (&self.mixer, &self.gdn) {
            (Some(m), None) => m.init_state(b, device),
            (None, Some(g)) => g.init_state(b, device),
            _ => panic!("Block: exactly one of mixer and gdn must be set"),
        }
    }
}

/// Decoding state of the whole model: one mixer state per block.
#[derive(Clone, Debug)]
pub struct ModelState {
    /// Per block.
    pub layers: Vec<MixerState>,
}

impl ModelState {
    /// Tokens absorbed so far.
    pub fn position(&self) -> usize {
        self.layers.first().map_or(0, |l| l.fenwick.position)
    }

    /// Bytes held on the device (conv windows and Fenwick levels of every block).
    pub fn size_bytes(&self) -> usize {
        self.layers.iter().map(MixerState::size_bytes).sum()
    }
}

/// Output of a sequence forward.
#[derive(Clone, Debug)]
pub struct LmOutput {
    /// The head's output over the padded vocabulary, in the compute dtype (bf16 under mixed
    /// precision); [`LmOutput::logits`] is the `[B, T, V]` view.
    pub head: PaddedLogits,
    /// λ of every block, `[B, T, H, L]` each, when traced.
    pub lambda: Vec<Tensor<4>>,
    /// The decoding state after the last token, when asked for.
    pub state: Option<ModelState>,
}

impl LmOutput {
    /// The logits `[B, T, V]` (a view of the padded head output).
    pub fn logits(&self) -> Tensor<3> {
        self.head.logits()
    }
}

/// The log-linear language model (Mamba-2 or Gated DeltaNet mixers).
#[derive(Module, Debug)]
pub struct LogLinearLm {
    /// Token embedding `[V, D]`.
    pub embedding: Param<Tensor<2>>,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub norm: RmsNorm,
    /// LM head (`None` when tied to the embedding).
    pub head: Option<Dense>,
    /// Configuration.
    #[module(skip)]
    pub config: LmConfig,
}

impl LogLinearLm {
    /// Logits of every position.
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn forward(&self, tokens: Tensor<2, Int>, form: Form) -> Tensor<3> {
        self.run(tokens, form, None, false, false).logits()
    }

    /// The full forward: optionally from a decoding state, returning the final state and/or
    /// every block's λ.
    ///
    /// # Shapes
    /// `tokens: [B, T]`.
    pub fn run(
        &self,
        tokens: Tensor<2, Int>,
        form: Form,
        state: Option<&ModelState>,
        return_state: bool,
        trace_lambda: bool,
    ) -> LmOutput {
        let mut h = self.embed(tokens);
        let mut lambda = Vec::new();
        let mut states = Vec::new();
        for (i, block) in self.blocks.iter().enumerate() {
            let out = block.mix(
                block.mixer_norm.forward(h.clone()),
                form,
                state.map(|s| &s.layers[i]),
                return_state,
            );
            let r = h + out.y;
            h = r.clone() + block.mlp.forward(block.mlp_norm.forward(r));
            if trace_lambda {
                lambda.push(out.lambda);
            }
            states.extend(out.state);
        }
        LmOutput {
            head: self.head(h),
            lambda,
            state: return_state.then_some(ModelState { layers: states }),
        }
    }

    /// Runs the prompt with the chunked form and returns its logits and the decoding state that
    /// stepping through it token by token would have built.
    ///
    /// # Shapes
    /// `tokens: [B, T]` → `[B, T, V]`.
    pub fn prefill(&self, tokens: Tensor<2, Int>, chunk: usize) -> (Tensor<3>, ModelState) {
        let out = self.run(tokens, Form::Chunked { chunk }, None, true, false);
        (out.logits(), out.state.expect("state requested"))
    }

    /// An empty decoding state for a batch of `b`.
    pub fn init_state(&self, b: usize, device: &Device) -> ModelState {
        ModelState {
            layers: self
                .blocks
                .iter()
                .map(|blk| blk.init_state(b, device))
                .collect(),
        }
    }

    /// One decoding step: O(log T) memory and time per token.
    ///
    /// # Shapes
    /// `token: [B]` → logits `[B, V]`.
    pub fn step(&self, token: Tensor<1, Int>, state: &mut ModelState) -> Tensor<2> {
        let mut h = self.embed(token.unsqueeze_dim(1)).squeeze_dim::<2>(1);
        for (block, st) in self.blocks.iter().zip(&mut state.layers) {
            let r = h.clone() + block.mix_step(block.mixer_norm.forward(h), st);
            h = r.clone()
                + block
                    .mlp
                    .forward(block.mlp_norm.forward(r).unsqueeze_dim(1))
                    .squeeze_dim(1);
        }
        self.head(h.unsqueeze_dim(1)).logits().squeeze_dim(1)
    }

    fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let table = self.embedding.val();
        let dtype = self.config.precision.compute_dtype(table.dtype());
        to_dtype(super::init::embed(table, tokens), dtype)
    }

    /// The head's logits in the compute dtype (bf16 under mixed precision), over the padded
    /// vocabulary: the loss reads them as they are and computes in f32. A cast to f32 would
    /// write and read the `[B, T, V]` logits twice more per step, forward and backward, for the
    /// same values (bench/RESULTS.md, session 9).
    fn head(&self, h: Tensor<3>) -> PaddedLogits {
        let h = self.norm.forward(h);
        match &self.head {
            Some(head) => super::init::vocab_logits(h, head.weight.val(), false),
            None => super::init::vocab_logits(h, self.embedding.val(), true),
        }
    }
}
