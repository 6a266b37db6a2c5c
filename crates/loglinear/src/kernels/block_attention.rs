//! Causal attention in blocks of queries with the backward recomputing the probabilities, for
//! the Transformer baseline at long sequences on CubeCL devices: nothing of size `T²` is kept
//! between the forward and the backward, and the key columns a block of queries cannot see are
//! never computed.
//!
//! Query block `[r0, r1)` (`block` rows) sees the keys `0 .. past + r1`; per block the forward is
//! two products ([`GemmKernels::gemm`]: cuBLAS on CUDA) around the causal-softmax kernel
//! ([`AttentionKernels::causal_softmax`]), and the backward recomputes the block's scores and
//! probabilities, then
//!
//! ```text
//! dP = dO_blk · V_seenᵀ,  dS = scale · P ⊙ (dP − Σ_j P dP)      (the softmax-backward kernel)
//! dQ_blk = dS · K_seen,   dK_seen += dSᵀ · Q_blk,   dV_seen += Pᵀ · dO_blk
//! ```
//!
//! with `dK` and `dV` summed over the blocks in f32. Against materialising the probabilities of
//! the whole sequence ([`super::attention`], which the Transformer uses up to
//! [`ATTENTION_BLOCK`] queries): memory `O(block · T)` instead of `O(T²)` a layer, the products
//! and the softmax passes over ≈ `(n + 1) / 2n` of the score matrix for `n` blocks instead of all
//! of it, and one more product and softmax pass (the recomputation) in the backward. Not a fused
//! (FlashAttention) kernel: each block's scores still go through device memory once each way.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata, backend_extension};
use burn::tensor::{FloatDType, Shape, Slice};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cubecl::CubeBackend;

use super::AttentionKernels;
use super::gemm::GemmKernels;

/// Queries per block in the Transformer's attention; sequences of at most this many queries take
/// the one-block path that keeps the probabilities instead ([`super::attention_softmax`]).
pub const ATTENTION_BLOCK: usize = 1024;

/// `[N, T, dv]` of attention with `q: [N, T, d]`, `k: [N, S, d]`, `v: [N, S, dv]`.
pub(crate) fn attention_shape(q: &Shape, k: &Shape, v: &Shape) -> Shape {
    let ([n, t, d], [nk, s, dk], [nv, sv, dv]) = (q.dims::<3>(), k.dims::<3>(), v.dims::<3>());
    assert!(
        n == nk && n == nv && d == dk && s == sv,
        "block_attention: q {:?}, k {:?}, v {:?} (expected [N, T, d], [N, S, d], [N, S, dv])",
        q.as_slice(),
        k.as_slice(),
        v.as_slice()
    );
    Shape::new([n, t, dv])
}

/// Blockwise causal attention as a backend extension with its own backward.
#[backend_extension(Cube, Fusion: cfg(feature = "fusion"), Autodiff)]
pub trait BlockAttentionKernels: Backend {
    /// `softmax(scale · q kᵀ + causal mask) · v` for `q: [N, T, d]`, `k: [N, S, d]`,
    /// `v: [N, S, dv]` (`S = past + T`: query `i` sits at position `past + i` and sees keys
    /// `0 ..= past + i`), computed `block` queries at a time; `[N, T, dv]` in the dtype of `q`.
    #[fusion(dtype = q, shape = attention_shape(q, k, v))]
    fn block_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> FloatTensor<Self>;

    /// `(dq, dk, dv)` of [`Self::block_attention`] for the output gradient `dout: [N, T, dv]`,
    /// recomputing the probabilities block by block.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = |q, k, v, _dout, _scale, _past, _block| (
        burn::backend::fusion::custom::TensorSpec::new(q.shape.clone(), q.dtype),
        burn::backend::fusion::custom::TensorSpec::new(k.shape.clone(), k.dtype),
        burn::backend::fusion::custom::TensorSpec::new(v.shape.clone(), v.dtype),
    ))]
    fn block_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl BlockAttentionKernels for CubeBackend {
    fn block_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> FloatTensor<Self> {
        forward::<Self>(q, k, v, scale, past, block)
    }

    fn block_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward::<Self>(q, k, v, dout, scale, past, block)
    }
}

/// The slices of `[:, rows, :]`.
fn row_slices(rows: std::ops::Range<usize>) -> [Slice; 3] {
    let range = Slice::new(rows.start as isize, Some(rows.end as isize), 1);
    [Slice::full(), range, Slice::full()]
}

/// `t[:, rows, :]` (a view where the offsets allow).
fn rows<B: Backend>(t: FloatTensor<B>, rows: std::ops::Range<usize>) -> FloatTensor<B> {
    B::float_slice(t, &row_slices(rows))
}

/// The query blocks `[r0, r1)` of `t` queries and, for each, the keys it sees (`past + r1`,
/// at most `keys`).
fn blocks(t: usize, keys: usize, past: usize, block: usize) -> Vec<(usize, usize, usize)> {
    assert!(block > 0, "block_attention: a block of 0 queries");
    (0..t)
        .step_by(block)
        .map(|r0| {
            let r1 = (r0 + block).min(t);
            (r0, r1, (past + r1).min(keys))
        })
        .collect()
}

/// One block's probabilities `[N, r1 − r0, seen]` (the causal mask offset by the block's
/// position).
fn probabilities<B: Backend + AttentionKernels + GemmKernels>(
    q_blk: FloatTensor<B>,
    k_seen: FloatTensor<B>,
    scale: f32,
    offset: usize,
) -> FloatTensor<B> {
    let scores = B::gemm(q_blk, B::float_swap_dims(k_seen, 1, 2));
    B::causal_softmax(scores, scale, offset)
}

fn forward<B: Backend + AttentionKernels + GemmKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    scale: f32,
    past: usize,
    block: usize,
) -> FloatTensor<B> {
    let _ = attention_shape(&q.shape(), &k.shape(), &v.shape());
    let (t, keys) = (q.shape()[1], k.shape()[1]);
    let mut outs: Vec<FloatTensor<B>> = blocks(t, keys, past, block)
        .into_iter()
        .map(|(r0, r1, seen)| {
            let p = probabilities::<B>(
                rows::<B>(q.clone(), r0..r1),
                rows::<B>(k.clone(), 0..seen),
                scale,
                past + r0,
            );
            B::gemm(p, rows::<B>(v.clone(), 0..seen))
        })
        .collect();
    if outs.len() == 1 {
        outs.pop().expect("one block")
    } else {
        B::float_cat(outs, 1)
    }
}

fn backward<B: Backend + AttentionKernels + GemmKernels>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    dout: FloatTensor<B>,
    scale: f32,
    past: usize,
    block: usize,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let out_shape = attention_shape(&q.shape(), &k.shape(), &v.shape());
    assert_eq!(
        dout.shape(),
        out_shape,
        "block_attention_backward: output gradient {:?} for an output {:?}",
        dout.shape().as_slice(),
        out_shape.as_slice()
    );
    let (t, keys) = (q.shape()[1], k.shape()[1]);
    let (dtype_k, dtype_v) = (k.dtype(), v.dtype());
    let device = q.device();
    // dK and dV gather a contribution from every block that sees a key: summed in f32 and
    // rounded once, as one product over the whole sequence would.
    let mut dk = B::float_zeros(k.shape(), &device, FloatDType::F32);
    let mut dv = B::float_zeros(v.shape(), &device, FloatDType::F32);
    let mut dq = Vec::new();
    for (r0, r1, seen) in blocks(t, keys, past, block) {
        let (q_blk, do_blk) = (
            rows::<B>(q.clone(), r0..r1),
            rows::<B>(dout.clone(), r0..r1),
        );
        let (k_seen, v_seen) = (rows::<B>(k.clone(), 0..seen), rows::<B>(v.clone(), 0..seen));
        let p = probabilities::<B>(q_blk.clone(), k_seen.clone(), scale, past + r0);
        let dp = B::gemm(do_blk.clone(), B::float_swap_dims(v_seen, 1, 2));
        let ds = B::causal_softmax_backward(p.clone(), dp, scale, past + r0);
        dq.push(B::gemm(ds.clone(), k_seen));
        let seen_rows = row_slices(0..seen);
        let add = |acc: FloatTensor<B>, part: FloatTensor<B>| {
            let part = B::float_cast(part, FloatDType::F32);
            let sum = B::float_add(B::float_slice(acc.clone(), &seen_rows), part);
            B::float_slice_assign(acc, &seen_rows, sum)
        };
        dk = add(dk, B::gemm(B::float_swap_dims(ds, 1, 2), q_blk));
        dv = add(dv, B::gemm(B::float_swap_dims(p, 1, 2), do_blk));
    }
    let dq = if dq.len() == 1 {
        dq.pop().expect("one block")
    } else {
        B::float_cat(dq, 1)
    };
    (
        dq,
        B::float_cast(dk, dtype_k.into()),
        B::float_cast(dv, dtype_v.into()),
    )
}

impl<B: Backend + BlockAttentionKernels, C: CheckpointStrategy> BlockAttentionKernels
    for Autodiff<B, C>
{
    fn block_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AttentionBackward;

        impl<B: Backend + BlockAttentionKernels> Backward<B, 3> for AttentionBackward {
            // The inputs only: the backward recomputes the probabilities.
            type State = ([FloatTensor<B>; 3], f32, usize, usize);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let grad = grads.consume::<B>(&ops.node);
                let ([q, k, v], scale, past, block) = ops.state;
                let (dq, dk, dv) = B::block_attention_backward(q, k, v, grad, scale, past, block);
                for (parent, g) in ops.parents.into_iter().zip([dq, dk, dv]) {
                    if let Some(node) = parent {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        let nodes = [q.node(), k.node(), v.node()];
        let inputs = [q.into_primitive(), k.into_primitive(), v.into_primitive()];
        let [a, b, c] = inputs.clone();
        let out = B::block_attention(a, b, c, scale, past, block);
        match AttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((inputs, scale, past, block), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn block_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        scale: f32,
        past: usize,
        block: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not itself differentiable: constants.
        let (a, b, c) = B::block_attention_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            dout.into_primitive(),
            scale,
            past,
            block,
        );
        let inner = <Self as burn::backend::AutodiffBackend>::from_inner;
        (inner(a), inner(b), inner(c))
    }
}
