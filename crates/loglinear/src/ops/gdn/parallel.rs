//! The quadratic form of log-linear Gated DeltaNet: the definition of the op (spec §5.2) and the
//! oracle every other form is tested against.

use burn::prelude::*;

use super::{GdnInput, empty_segment};
use crate::fenwick;
use crate::ops::{
    AttnOutput, FenwickState, final_state, float_tensor, heads_first, initial_state_output,
    int_tensor,
};

/// `O = M V` with, for `s ≤ t` (zero above the diagonal),
///
/// ```text
/// M[t,s] = λ_t^(level(t,s)) · exp(Γ_t − Γ_s) · q_tᵀ (Π_{r=s+1}^{t} (I − β_r k_r k_rᵀ)) β_s k_s
/// ```
///
/// (newest factor leftmost, `Γ = cumsum(g)`): the scalar decays factor out of the transitions
/// `𝒜_r = a_r (I − β_r k_r k_rᵀ)`, so they are differences of cumulative sums as in the Mamba-2
/// op. The products are applied to all query rows at once, one key at a time from the newest:
/// O(T²·N) time, T sequential steps, O(T²) memory.
///
/// # Shapes
/// See [`GdnInput`]; `o: [B, T, H, P]`.
pub fn parallel(x: &GdnInput, initial: Option<&FenwickState>, return_state: bool) -> AttnOutput {
    const OP: &str = "gdn_attn(parallel)";
    let d = x.dims();
    let start = initial.map_or(0, |s| s.position);
    fenwick::check_levels(OP, d.l, start + d.t);
    if let Some(s) = initial {
        s.check(OP, &d);
    }
    if d.t == 0 {
        return empty_segment(x, initial, return_state);
    }
    let (b, t, h) = (d.b, d.t, d.h);
    let device = x.device();
    let q = heads_first(x.q.clone()); // [B, H, T, N]
    let k = heads_first(x.k.clone()); // [B, H, T, N]
    let v = heads_first(x.v.clone()); // [B, H, T, P]
    let beta = x.beta.clone().swap_dims(1, 2); // [B, H, T]
    let lambda = heads_first(x.lambda.clone()); // [B, H, T, L]
    let gamma = x.g.clone().swap_dims(1, 2).cumsum(2); // [B, H, T]

    let (scores, q_start) = delta_scores(&q, &k, &beta); // [B, H, T, T], [B, H, T, N]
    let mut levels = vec![0i64; t * t];
    for i in 0..t {
        for j in 0..=i {
            levels[i * t + j] = fenwick::level(start + i, start + j) as i64;
        }
    }
    let levels = int_tensor(levels, [1, 1, t, t], &device).expand([b, h, t, t]);
    let hier = lambda.clone().gather(3, levels); // [B, H, T, T]
    let above = Tensor::<2, Bool>::tril_mask([t, t], 0, &device)
        .unsqueeze::<4>()
        .expand([b, h, t, t]);
    let diff = gamma.clone().unsqueeze_dim::<4>(3) - gamma.clone().unsqueeze_dim::<4>(2);
    let decay = diff.mask_fill(above.clone(), 0.0).exp(); // [B, H, T, T]
    let mask = (scores * decay * hier).mask_fill(above, 0.0);
    let mut o = mask.matmul(v.clone()); // [B, H, T, P]

    // An old level reaches query t through every transition of the segment up to t: the
    // carried-back query q_start, decayed by exp(Γ_t).
    if let Some(init) = initial {
        o = o + initial_state_output(&q_start, &lambda, &gamma, init);
    }
    let state = return_state.then(|| {
        let (k_end, through) = keys_to_end(&k, &beta, initial.is_some());
        let moved = initial.zip(through).map(|(init, through)| {
            let [_, _, l0, n, p] = init.levels.dims();
            // Π_r (I − β_r k_r k_rᵀ) applied to every old level at once: [B, H, N, L0·P].
            let s0 = init
                .levels
                .clone()
                .permute([0, 1, 3, 2, 4])
                .reshape([b, h, n, l0 * p]);
            let levels = through
                .matmul(s0)
                .reshape([b, h, n, l0, p])
                .permute([0, 1, 3, 2, 4]);
            FenwickState {
                levels,
                position: init.position,
            }
        });
        final_state(&k_end, &v, &gamma, d.l, moved.as_ref().or(initial))
    });
    AttnOutput {
        o: o.swap_dims(1, 2),
        state,
    }
}

/// The undecayed delta-rule scores `Â[t,s] = q_tᵀ (Π_{r=s+1}^{t} (I − β_r k_r k_rᵀ)) β_s k_s`
/// for `s ≤ t` (zero above the diagonal), and every query carried back through the whole
/// segment, `q_tᵀ Π_{r=0}^{t} (I − β_r k_r k_rᵀ)`.
///
/// Row `t` of `rows` holds `q_tᵀ Π_{r=s+1}^{t} (…)` when key `s` is reached (keys from the
/// newest); it scores key `s` and then takes the factor `(I − β_s k_s k_sᵀ)`. Rows `t < s` have
/// not met their own key yet and are left alone.
///
/// # Shapes
/// `q, k: [B, H, T, N]`, `beta: [B, H, T]` → `[B, H, T, T]`, `[B, H, T, N]`.
fn delta_scores(q: &Tensor<4>, k: &Tensor<4>, beta: &Tensor<3>) -> (Tensor<4>, Tensor<4>) {
    let [_, _, t, _] = q.dims();
    // reached[t, s] = 1 for t ≥ s
    let reached: Vec<f64> = (0..t * t)
        .map(|i| f64::from(u8::from(i / t >= i % t)))
        .collect();
    let reached = float_tensor(reached, [1, 1, t, t], q.dtype(), &q.device());
    let mut rows = q.clone();
    let mut columns = Vec::with_capacity(t);
    for s in (0..t).rev() {
        let ks = k.clone().narrow(2, s, 1); // [B, H, 1, N]
        let bs = beta.clone().narrow(2, s, 1).unsqueeze_dim::<4>(3); // [B, H, 1, 1]
        let mask = reached.clone().narrow(3, s, 1); // [1, 1, T, 1]
        let hit = rows.clone().matmul(ks.clone().swap_dims(2, 3)) * mask * bs; // [B, H, T, 1]
        rows = rows - hit.clone().matmul(ks);
        columns.push(hit);
    }
    columns.reverse();
    (Tensor::cat(columns, 3), rows)
}

/// Every key carried forward to the end of the segment,
/// `k̃_s = Π_{r=s+1}^{T−1} (I − β_r k_r k_rᵀ) β_s k_s` (undecayed), and with `through` the
/// whole segment's product `Π_{r=0}^{T−1} (I − β_r k_r k_rᵀ)` (what an initial state goes
/// through).
///
/// # Shapes
/// `k: [B, H, T, N]`, `beta: [B, H, T]` → `[B, H, T, N]`, `[B, H, N, N]`.
fn keys_to_end(k: &Tensor<4>, beta: &Tensor<3>, through: bool) -> (Tensor<4>, Option<Tensor<4>>) {
    let [b, h, t, n] = k.dims();
    let device = k.device();
    // later[s, r] = 1 for s < r: key s goes through the transition of token r
    let later: Vec<f64> = (0..t * t)
        .map(|i| f64::from(u8::from(i / t < i % t)))
        .collect();
    let later = float_tensor(later, [1, 1, t, t], k.dtype(), &device);
    let mut rows = k.clone() * beta.clone().unsqueeze_dim(3);
    let mut product = through.then(|| {
        let eye: Vec<f64> = (0..n * n)
            .map(|i| f64::from(u8::from(i / n == i % n)))
            .collect();
        float_tensor(eye, [1, 1, n, n], k.dtype(), &device).expand([b, h, n, n])
    });
    for r in 0..t {
        let kr = k.clone().narrow(2, r, 1); // [B, H, 1, N]
        let br = beta.clone().narrow(2, r, 1).unsqueeze_dim::<4>(3); // [B, H, 1, 1]
        let mask = later.clone().narrow(3, r, 1); // [1, 1, T, 1]
        let hit = rows.clone().matmul(kr.clone().swap_dims(2, 3)) * mask * br.clone(); // [B, H, T, 1]
        rows = rows - hit.matmul(kr.clone());
        product = product.map(|m| {
            let kt_m = kr.clone().matmul(m.clone()) * br; // [B, H, 1, N]
            m - kr.swap_dims(2, 3).matmul(kt_m)
        });
    }
    (rows, product)
}
