//! The inputs of the core op and their sizes.

use burn::prelude::*;
use burn::tensor::DType;

/// Inputs of the core op, per head. Positions are counted from the start of this segment; an
/// initial [`FenwickState`] shifts them by its `position`.
///
/// # Shapes
/// `q, k: [B, T, H, N]`, `v: [B, T, H, P]`, `g: [B, T, H]` (log-decay, ≤ 0),
/// `lambda: [B, T, H, L]` with `L ≥ num_levels(position + T)`.
#[derive(Clone, Debug)]
pub struct LogLinearInput {
    /// Queries `[B, T, H, N]` (Mamba-2: `C`).
    pub q: Tensor<4>,
    /// Keys `[B, T, H, N]` (Mamba-2: `B`).
    pub k: Tensor<4>,
    /// Values `[B, T, H, P]` (Mamba-2: `Δ·x`).
    pub v: Tensor<4>,
    /// Log-decay `[B, T, H]` (Mamba-2: `A·Δ`).
    pub g: Tensor<3>,
    /// Level weights `[B, T, H, L]`.
    pub lambda: Tensor<4>,
}

/// Sizes of a [`LogLinearInput`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Key/query width.
    pub n: usize,
    /// Value width.
    pub p: usize,
    /// λ slots.
    pub l: usize,
}

impl LogLinearInput {
    /// Checks that the five tensors agree and returns their sizes.
    ///
    /// # Panics
    /// With a message naming the tensor and both shapes when they do not fit together.
    pub fn dims(&self) -> Dims {
        let [b, t, h, n] = self.q.dims();
        let d = Dims {
            b,
            t,
            h,
            n,
            p: self.v.dims()[3],
            l: self.lambda.dims()[3],
        };
        let expect = |name: &str, got: &[usize], want: &[usize]| {
            assert!(
                got == want,
                "log_linear_attn: {name} has shape {got:?}, expected {want:?} \
                 (from q [B, T, H, N] = {:?})",
                self.q.dims()
            );
        };
        expect("k", &self.k.dims(), &[b, t, h, n]);
        expect("v", &self.v.dims(), &[b, t, h, d.p]);
        expect("g", &self.g.dims(), &[b, t, h]);
        expect("lambda", &self.lambda.dims(), &[b, t, h, d.l]);
        assert!(d.l > 0, "log_linear_attn: lambda needs at least one level");
        d
    }

    /// The float dtype of the inputs.
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }

    /// The device of the inputs.
    pub fn device(&self) -> Device {
        self.q.device()
    }

    /// Fresh leaves that require gradients (detached from any earlier graph); the tensors must
    /// live on an autodiff device.
    pub fn require_grad(&self) -> Self {
        Self {
            q: self.q.clone().detach().require_grad(),
            k: self.k.clone().detach().require_grad(),
            v: self.v.clone().detach().require_grad(),
            g: self.g.clone().detach().require_grad(),
            lambda: self.lambda.clone().detach().require_grad(),
        }
    }

    /// The tokens `start..start + len` of this segment.
    pub fn narrow(&self, start: usize, len: usize) -> Self {
        Self {
            q: self.q.clone().narrow(1, start, len),
            k: self.k.clone().narrow(1, start, len),
            v: self.v.clone().narrow(1, start, len),
            g: self.g.clone().narrow(1, start, len),
            lambda: self.lambda.clone().narrow(1, start, len),
        }
    }
}
