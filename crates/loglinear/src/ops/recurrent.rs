//! The recurrent form: O(log T) Fenwick states stepped token by token (spec §3.2). It is also the
//! decoding path, so it takes and returns the state.

use burn::prelude::*;

use super::{FenwickState, LogLinearInput, zeros_as};
use crate::fenwick;

/// Steps every token of `x` through the Fenwick recurrence, starting from `initial` (or empty).
///
/// # Shapes
/// See [`LogLinearInput`]; returns `o: [B, T, H, P]` and the state `[B, H, L, N, P]`.
pub fn recurrent(x: &LogLinearInput, initial: Option<&FenwickState>) -> (Tensor<4>, FenwickState) {
    let d = x.dims();
    let start = initial.map_or(0, |s| s.position);
    fenwick::check_levels("log_linear_attn(recurrent)", d.l, start + d.t);
    let mut state = match initial {
        Some(s) => {
            s.check("log_linear_attn(recurrent)", &d);
            s.clone()
        }
        None => FenwickState::empty(d.b, d.h, d.l, d.n, d.p, x.dtype(), &x.device()),
    };
    let mut outputs = Vec::with_capacity(d.t);
    for i in 0..d.t {
        let token = |t: Tensor<4>| t.narrow(1, i, 1).squeeze_dim::<3>(1);
        let o = recurrent_step(
            &mut state,
            token(x.q.clone()),
            token(x.k.clone()),
            token(x.v.clone()),
            x.g.clone().narrow(1, i, 1).squeeze_dim(1),
            token(x.lambda.clone()),
        );
        outputs.push(o);
    }
    let o = if outputs.is_empty() {
        zeros_as(&x.v, [d.b, 0, d.h, d.p])
    } else {
        Tensor::stack(outputs, 1)
    };
    (o, state)
}

/// One token of the Fenwick recurrence:
/// 1. carry: levels `0..m` fold into level `m` (`m` = [`fenwick::carry_levels`]);
/// 2. decay every level by `exp(g)`; 3. insert `k vᵀ` at level 0;
/// 4. read out `o = qᵀ Σ_ℓ λ_ℓ S^(ℓ)`.
///
/// # Shapes
/// `q, k: [B, H, N]`, `v: [B, H, P]`, `g: [B, H]`, `lambda: [B, H, L]` → `o: [B, H, P]`.
pub fn recurrent_step(
    state: &mut FenwickState,
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    g: Tensor<2>,
    lambda: Tensor<3>,
) -> Tensor<3> {
    let [b, h, l, n, p] = state.levels.dims();
    let t = state.position;
    fenwick::check_levels("recurrent_step", l, t + 1);
    assert!(
        q.dims() == [b, h, n] && k.dims() == [b, h, n] && v.dims() == [b, h, p],
        "recurrent_step: q {:?}, k {:?}, v {:?} do not fit a state [B, H, L, N, P] = {:?}",
        q.dims(),
        k.dims(),
        v.dims(),
        state.levels.dims()
    );
    assert!(
        g.dims() == [b, h] && lambda.dims() == [b, h, l],
        "recurrent_step: g {:?} / lambda {:?} do not fit a state {:?}",
        g.dims(),
        lambda.dims(),
        state.levels.dims()
    );
    let levels = carry(state.levels.clone(), t) * g.exp().reshape([b, h, 1, 1, 1]);
    let kv = k.unsqueeze_dim::<4>(3).matmul(v.unsqueeze_dim(2)); // [B, H, N, P]
    let levels = with_level0(levels, kv);
    let o = read_out(&levels, q, lambda);
    state.levels = levels;
    state.position = t + 1;
    o
}

/// Step 1 of the recurrence before token `t` is inserted: levels `0..m` fold into level `m`
/// (`m` = [`fenwick::carry_levels`]`(t)`), emptying them.
///
/// # Shapes
/// `levels: [B, H, L, N, P]` → `[B, H, L, N, P]`.
pub(crate) fn carry(levels: Tensor<5>, t: usize) -> Tensor<5> {
    let [b, h, l, n, p] = levels.dims();
    let m = fenwick::carry_levels(t);
    if m == 0 {
        return levels;
    }
    let folded = levels.clone().narrow(2, 0, m + 1).sum_dim(2); // [B, H, 1, N, P]
    let mut parts = vec![zeros_as(&levels, [b, h, m, n, p]), folded];
    if m + 1 < l {
        parts.push(levels.narrow(2, m + 1, l - m - 1));
    }
    Tensor::cat(parts, 2)
}

/// Replaces level 0 (emptied by the carry) with the new token's insertion `kv`.
///
/// # Shapes
/// `levels: [B, H, L, N, P]`, `kv: [B, H, N, P]` → `[B, H, L, N, P]`.
pub(crate) fn with_level0(levels: Tensor<5>, kv: Tensor<4>) -> Tensor<5> {
    let l = levels.dims()[2];
    if l > 1 {
        Tensor::cat(vec![kv.unsqueeze_dim(2), levels.narrow(2, 1, l - 1)], 2)
    } else {
        kv.unsqueeze_dim(2)
    }
}

/// Step 4 of the recurrence: `o = qᵀ Σ_ℓ λ_ℓ S^(ℓ)`.
///
/// # Shapes
/// `levels: [B, H, L, N, P]`, `q: [B, H, N]`, `lambda: [B, H, L]` → `[B, H, P]`.
pub(crate) fn read_out(levels: &Tensor<5>, q: Tensor<3>, lambda: Tensor<3>) -> Tensor<3> {
    let [b, h, l, n, p] = levels.dims();
    let mixed = lambda
        .unsqueeze_dim::<4>(2)
        .matmul(levels.clone().reshape([b, h, l, n * p])) // [B, H, 1, N·P]
        .reshape([b, h, n, p]);
    q.unsqueeze_dim::<4>(2).matmul(mixed).reshape([b, h, p])
}
