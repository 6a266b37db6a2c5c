//! The O(log T) Fenwick state of the recurrent form and of decoding (spec §3.2).

use burn::prelude::*;
use burn::tensor::DType;

use crate::fenwick;

/// Per-level states after `position` tokens: level `ℓ` holds
/// `Σ_{s ∈ bucket ℓ} exp(Γ_last − Γ_s) · k_s v_sᵀ` for the buckets of the last position.
///
/// The occupancy counts of the spec's binary counter are not stored: they follow from
/// `position` ([`fenwick::occupancy`]), which also makes the state valid for any batch row.
///
/// # Shapes
/// `levels: [B, H, L, N, P]`.
#[derive(Clone, Debug)]
pub struct FenwickState {
    /// Level states `[B, H, L, N, P]`.
    pub levels: Tensor<5>,
    /// Number of tokens already absorbed (the global position of the next token).
    pub position: usize,
}

impl FenwickState {
    /// The state before the first token: all levels zero, position 0.
    pub fn empty(
        b: usize,
        h: usize,
        l: usize,
        n: usize,
        p: usize,
        dtype: DType,
        device: &Device,
    ) -> Self {
        Self {
            levels: Tensor::zeros([b, h, l, n, p], (device, dtype)),
            position: 0,
        }
    }

    /// Number of λ slots.
    pub fn num_levels(&self) -> usize {
        self.levels.dims()[2]
    }

    /// Tokens held at each level (the spec's counts `n_ℓ`).
    pub fn occupancy(&self) -> Vec<usize> {
        fenwick::occupancy(self.position, self.num_levels())
    }

    /// One member of the bucket held at `level`, or `None` for an empty level.
    pub(crate) fn representative(&self, level: usize) -> Option<usize> {
        let last = self.position.checked_sub(1)?;
        let range = fenwick::bucket(last, level);
        (!range.is_empty()).then_some(range.start)
    }

    /// The state of one level, `[B, H, N, P]`.
    pub fn level(&self, level: usize) -> Tensor<4> {
        self.levels.clone().narrow(2, level, 1).squeeze_dim(2)
    }

    /// Bytes the state occupies on its device (the occupancy needs no storage).
    pub fn size_bytes(&self) -> usize {
        self.levels.shape().num_elements() * self.levels.dtype().size()
    }

    /// Detached from any autodiff graph (for decoding across many steps).
    pub fn detach(self) -> Self {
        Self {
            levels: self.levels.detach(),
            position: self.position,
        }
    }
}

impl FenwickState {
    /// Panics unless this state fits inputs of sizes `d` (op names the caller).
    pub(crate) fn check(&self, op: &str, d: &super::Dims) {
        let want = [d.b, d.h, d.l, d.n, d.p];
        assert!(
            self.levels.dims() == want,
            "{op}: initial state has shape {:?}, expected [B, H, L, N, P] = {want:?}",
            self.levels.dims()
        );
    }
}
