//! The next-token loss: softmax cross-entropy per row of logits.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;

use super::init::{PaddedLogits, to_dtype, wide};

/// `logsumexp(x) − x[target]` per row, in f32 (half-precision logits are read as they are): on a
/// CubeCL device the fused kernels (one read of the logits forward, one read and one write
/// backward; feature `kernels`), elsewhere [`reference_cross_entropy_rows`]. Targets must lie in
/// `0..V`; callers mask the rows they do not score.
///
/// # Shapes
/// `logits: [rows, V]`, `targets: [rows]` → `[rows]`.
pub fn cross_entropy_rows(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    #[cfg(feature = "kernels")]
    if let Some(nll) = crate::kernels::softmax_cross_entropy(&logits, &targets, logits.dims()[1]) {
        return nll;
    }
    reference_cross_entropy_rows(logits, targets)
}

/// [`cross_entropy_rows`] for every token of a batch of sequences. On a CubeCL device the
/// kernels read the logits where they lie: a `[B, T, V]` tensor whose rows the allocator pitched
/// (V = 50,257 on CUDA) would be copied whole by a reshape to `[B·T, V]`.
///
/// # Shapes
/// `logits: [B, T, V]`, `targets: [B, T]` → `[B, T]`.
pub fn cross_entropy_tokens(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<2> {
    let vocab = logits.dims()[2];
    cross_entropy_padded_tokens(
        &PaddedLogits {
            padded: logits,
            vocab,
        },
        targets,
    )
}

/// [`cross_entropy_tokens`] of the head's output over a padded vocabulary: only the first
/// `vocab` columns are scored, and on a CubeCL device the padded tensor is read in place (no
/// view of the first `vocab` columns is made, which under fusion is a copy, nor its backward,
/// which writes a zeroed padded tensor); the padding's gradient is 0.
///
/// # Shapes
/// `logits.padded: [B, T, V']`, `targets: [B, T]` (in `0..vocab`) → `[B, T]`.
pub fn cross_entropy_padded_tokens(logits: &PaddedLogits, targets: Tensor<2, Int>) -> Tensor<2> {
    #[cfg(feature = "kernels")]
    if let Some(nll) = crate::kernels::softmax_cross_entropy(&logits.padded, &targets, logits.vocab)
    {
        return nll;
    }
    let view = logits.logits();
    let [b, t, v] = view.dims();
    reference_cross_entropy_rows(view.reshape([b * t, v]), targets.reshape([b * t])).reshape([b, t])
}

/// [`cross_entropy_rows`] as tensor ops: `−log_softmax(x)[target]` (the definition, and the form
/// on the CPU).
pub fn reference_cross_entropy_rows(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let [rows, _] = logits.dims();
    let dtype = wide(logits.dtype());
    log_softmax(to_dtype(logits, dtype), 1)
        .gather(1, targets.reshape([rows, 1]))
        .reshape([rows])
        .neg()
}
