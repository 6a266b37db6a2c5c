//! The O(log T) Fenwick state of the recurrent form and of decoding (spec §3.2).

use burn::prelude::*;
use burn::tensor::DType;

use super::{float_tensor, int_tensor, zeros_as};
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

/// The contribution of an initial state to the outputs of a segment, shared by the parallel and
/// chunked forms.
///
/// Old level `ℓ₀` of a state at `position = T₀` holds a bucket of positions before `T₀`; every
/// position of that bucket has the same level `level(t, r)` seen from a later query `t`
/// (buckets are aligned dyadic blocks), where `r` is any member. So
/// `o[t] += Σ_ℓ₀ λ[t, level(t, r_ℓ₀)] · exp(Γ[t]) · q[t]ᵀ S₀^(ℓ₀)` with `Γ` the inclusive
/// cumulative log-decay of the segment.
///
/// # Shapes
/// `q: [B, H, T, N]`, `lambda: [B, H, T, L]`, `gamma: [B, H, T]` → `[B, H, T, P]`.
pub(crate) fn initial_state_output(
    q: &Tensor<4>,
    lambda: &Tensor<4>,
    gamma: &Tensor<3>,
    initial: &FenwickState,
) -> Tensor<4> {
    let [b, h, t, n] = q.dims();
    let l = lambda.dims()[3];
    let [_, _, l0, _, p] = initial.levels.dims();
    let start = initial.position;
    let device = q.device();
    // Level read by query i for old level j, and whether old level j is occupied.
    let mut index = vec![0i64; t * l0];
    let mut occupied = vec![0f64; l0];
    for (j, occ) in occupied.iter_mut().enumerate() {
        if let Some(r) = initial.representative(j) {
            *occ = 1.0;
            for i in 0..t {
                index[i * l0 + j] = fenwick::level(start + i, r).min(l - 1) as i64;
            }
        }
    }
    let index = int_tensor(index, [1, 1, t, l0], &device).expand([b, h, t, l0]);
    let occupied = float_tensor(occupied, [1, 1, 1, l0], q.dtype(), &device);
    // [B, H, T, L0]: λ of the level each old level lands on, times the decay since T₀.
    let weight = lambda.clone().gather(3, index) * occupied * gamma.clone().exp().unsqueeze_dim(3);
    // q · S₀ for every old level at once: [B, H, N, L0·P].
    let s0 = initial
        .levels
        .clone()
        .permute([0, 1, 3, 2, 4])
        .reshape([b, h, n, l0 * p]);
    let read = q.clone().matmul(s0).reshape([b, h, t, l0, p]);
    (read * weight.unsqueeze_dim(4)).sum_dim(3).squeeze_dim(3)
}

/// The state after the last token of a segment, from its tokens and the initial state; shared by
/// the parallel and chunked forms. Every token lands in exactly one bucket of the final query
/// position (contiguous ranges), so each level is one `kᵀ·(w ⊙ v)` product.
///
/// # Shapes
/// `k: [B, H, T, N]`, `v: [B, H, T, P]`, `gamma: [B, H, T]` → levels `[B, H, L, N, P]`.
pub(crate) fn final_state(
    k: &Tensor<4>,
    v: &Tensor<4>,
    gamma: &Tensor<3>,
    levels: usize,
    initial: Option<&FenwickState>,
) -> FenwickState {
    let [b, h, t, n] = k.dims();
    let p = v.dims()[3];
    let start = initial.map_or(0, |s| s.position);
    let end = start + t;
    if t == 0 {
        return match initial {
            Some(s) => s.clone(),
            None => FenwickState::empty(b, h, levels, n, p, k.dtype(), &k.device()),
        };
    }
    let last = end - 1;
    let gamma_end = gamma.clone().narrow(2, t - 1, 1); // [B, H, 1]
    let mut slots: Vec<Option<Tensor<4>>> = vec![None; levels];
    for (l, range) in fenwick::buckets(last) {
        let lo = range.start.max(start);
        let hi = range.end;
        if lo >= hi {
            continue;
        }
        let (i0, len) = (lo - start, hi - lo);
        let w = (gamma_end.clone() - gamma.clone().narrow(2, i0, len)).exp(); // [B, H, len]
        let kk = k.clone().narrow(2, i0, len).swap_dims(2, 3); // [B, H, N, len]
        let vv = v.clone().narrow(2, i0, len) * w.unsqueeze_dim(3); // [B, H, len, P]
        slots[l] = Some(kk.matmul(vv));
    }
    if let Some(init) = initial {
        let decay = gamma_end.exp().unsqueeze_dim(3); // [B, H, 1, 1]
        for j in 0..init.levels.dims()[2] {
            if let Some(r) = init.representative(j) {
                let l = fenwick::level(last, r);
                let old = init.level(j) * decay.clone();
                slots[l] = Some(match slots[l].take() {
                    Some(s) => s + old,
                    None => old,
                });
            }
        }
    }
    let zeros: Tensor<4> = zeros_as(k, [b, h, n, p]);
    let levels = slots
        .into_iter()
        .map(|s| s.unwrap_or_else(|| zeros.clone()))
        .collect();
    FenwickState {
        levels: Tensor::stack(levels, 2),
        position: end,
    }
}
