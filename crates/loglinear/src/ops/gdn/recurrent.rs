//! The recurrent form of log-linear Gated DeltaNet: O(log T) Fenwick states of `N × P` matrices
//! stepped token by token (spec §3.2 with the transition of §5.2). It is the decoding path.

use burn::prelude::*;

use super::GdnInput;
use crate::fenwick;
use crate::ops::{FenwickState, carry, read_out, with_level0, zeros_as};

/// Steps every token of `x` through the Fenwick recurrence, starting from `initial` (or empty).
///
/// # Shapes
/// See [`GdnInput`]; returns `o: [B, T, H, P]` and the state `[B, H, L, N, P]`.
pub fn recurrent(x: &GdnInput, initial: Option<&FenwickState>) -> (Tensor<4>, FenwickState) {
    const OP: &str = "gdn_attn(recurrent)";
    let d = x.dims();
    let start = initial.map_or(0, |s| s.position);
    fenwick::check_levels(OP, d.l, start + d.t);
    let mut state = match initial {
        Some(s) => {
            s.check(OP, &d);
            s.clone()
        }
        None => FenwickState::empty(d.b, d.h, d.l, d.n, d.p, x.dtype(), &x.device()),
    };
    let mut outputs = Vec::with_capacity(d.t);
    for i in 0..d.t {
        let token4 = |t: Tensor<4>| t.narrow(1, i, 1).squeeze_dim::<3>(1);
        let token3 = |t: Tensor<3>| t.narrow(1, i, 1).squeeze_dim::<2>(1);
        outputs.push(recurrent_step(
            &mut state,
            token4(x.q.clone()),
            token4(x.k.clone()),
            token4(x.v.clone()),
            token3(x.g.clone()),
            token3(x.beta.clone()),
            token4(x.lambda.clone()),
        ));
    }
    let o = if outputs.is_empty() {
        zeros_as(&x.v, [d.b, 0, d.h, d.p])
    } else {
        Tensor::stack(outputs, 1)
    };
    (o, state)
}

/// One token of the Fenwick recurrence with the Gated DeltaNet transition:
/// 1. carry: levels `0..m` fold into level `m` (`m` = [`fenwick::carry_levels`]);
/// 2. every level goes through `𝒜 = a (I − β k kᵀ)`, `a = exp(g)`: `S ← a (S − β k (kᵀ S))`;
/// 3. insert `β k vᵀ` at level 0; 4. read out `o = qᵀ Σ_ℓ λ_ℓ S^(ℓ)`.
///
/// # Shapes
/// `q, k: [B, H, N]`, `v: [B, H, P]`, `g, beta: [B, H]`, `lambda: [B, H, L]` →
/// `o: [B, H, P]`.
pub fn recurrent_step(
    state: &mut FenwickState,
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    g: Tensor<2>,
    beta: Tensor<2>,
    lambda: Tensor<3>,
) -> Tensor<3> {
    let [b, h, l, n, p] = state.levels.dims();
    let t = state.position;
    fenwick::check_levels("gdn recurrent_step", l, t + 1);
    assert!(
        q.dims() == [b, h, n] && k.dims() == [b, h, n] && v.dims() == [b, h, p],
        "gdn recurrent_step: q {:?}, k {:?}, v {:?} do not fit a state [B, H, L, N, P] = {:?}",
        q.dims(),
        k.dims(),
        v.dims(),
        state.levels.dims()
    );
    assert!(
        g.dims() == [b, h] && beta.dims() == [b, h] && lambda.dims() == [b, h, l],
        "gdn recurrent_step: g {:?} / beta {:?} / lambda {:?} do not fit a state {:?}",
        g.dims(),
        beta.dims(),
        lambda.dims(),
        state.levels.dims()
    );
    let levels = carry(state.levels.clone(), t);
    let row = k.clone().reshape([b, h, 1, 1, n]).expand([b, h, l, 1, n]);
    let column = k.clone().reshape([b, h, 1, n, 1]).expand([b, h, l, n, 1]);
    let kt_s = row.matmul(levels.clone()); // [B, H, L, 1, P]
    let removed = column.matmul(kt_s) * beta.clone().reshape([b, h, 1, 1, 1]);
    let levels = (levels - removed) * g.exp().reshape([b, h, 1, 1, 1]);
    let kv = (k * beta.reshape([b, h, 1]))
        .unsqueeze_dim::<4>(3)
        .matmul(v.unsqueeze_dim(2)); // [B, H, N, P]
    let levels = with_level0(levels, kv);
    let o = read_out(&levels, q, lambda);
    state.levels = levels;
    state.position = t + 1;
    o
}
