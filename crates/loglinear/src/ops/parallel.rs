//! The quadratic ("masked attention") form: the definition of the op and the oracle every other
//! form is tested against (spec §3.1).

use burn::prelude::*;

use super::{
    AttnOutput, FenwickState, LogLinearInput, final_state, heads_first, initial_state_output,
    int_tensor,
};
use crate::fenwick;

/// `O = (Q Kᵀ ⊙ Dm ⊙ Hm) V` with `Dm[t,s] = exp(Γ_t − Γ_s)` and `Hm[t,s] = λ_t^(level(t,s))`
/// for `s ≤ t` (zero above the diagonal). O(T²) time and memory.
///
/// # Shapes
/// See [`LogLinearInput`]; `o: [B, T, H, P]`.
pub fn parallel(
    x: &LogLinearInput,
    initial: Option<&FenwickState>,
    return_state: bool,
) -> AttnOutput {
    let d = x.dims();
    let start = initial.map_or(0, |s| s.position);
    fenwick::check_levels("log_linear_attn(parallel)", d.l, start + d.t);
    if let Some(s) = initial {
        s.check("log_linear_attn(parallel)", &d);
    }
    let (b, t, h) = (d.b, d.t, d.h);
    let device = x.device();
    let q = heads_first(x.q.clone()); // [B, H, T, N]
    let k = heads_first(x.k.clone()); // [B, H, T, N]
    let v = heads_first(x.v.clone()); // [B, H, T, P]
    let lambda = heads_first(x.lambda.clone()); // [B, H, T, L]
    let gamma = x.g.clone().swap_dims(1, 2).cumsum(2); // [B, H, T]

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
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)); // [B, H, T, T]
    let mask = (scores * decay * hier).mask_fill(above, 0.0);
    let mut o = mask.matmul(v.clone()); // [B, H, T, P]
    if let Some(init) = initial {
        o = o + initial_state_output(&q, &lambda, &gamma, init);
    }
    let state = return_state.then(|| final_state(&k, &v, &gamma, d.l, initial));
    AttnOutput {
        o: o.swap_dims(1, 2),
        state,
    }
}
