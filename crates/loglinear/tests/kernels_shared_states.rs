//! The fused kernels with their level states in shared memory (`LOGLINEAR_FUSED_STATES=shared`;
//! the default keeps them in global memory), against the float64 parallel form. A separate test
//! binary because the placement is chosen per process.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::prelude::*;
use burn::tensor::DType;
use loglinear::fenwick::num_levels;
use loglinear::ops::Dims;
use loglinear::testing::{check_fused, test_seed};

#[test]
fn fused_with_shared_states_matches_reference() {
    // SAFETY: set before any kernel launches, in this process's only test.
    unsafe { std::env::set_var("LOGLINEAR_FUSED_STATES", "shared") };
    #[cfg(feature = "cuda")]
    let device = Device::cuda(0);
    #[cfg(not(feature = "cuda"))]
    let device = Device::wgpu(Default::default());
    let seed = test_seed(0);
    for (t, n, p) in [(1, 16, 16), (70, 32, 16), (200, 16, 48), (700, 16, 16)] {
        let dims = Dims {
            b: 2,
            t,
            h: 2,
            n,
            p,
            l: num_levels(t),
        };
        let results = check_fused(&device, dims, DType::F32, DType::F32, seed + t as u64)
            .unwrap_or_else(|why| panic!("{dims:?}: the kernels did not run: {why}"));
        for (name, c) in results.into_iter().take(6) {
            let ok = if name == "dg" && t == 1 {
                c.max_abs <= 1e-3
            } else {
                c.max_rel <= 5e-5
            };
            assert!(
                ok && !c.non_finite,
                "{dims:?} seed {}: {name} {:.2e}",
                seed + t as u64,
                c.max_rel
            );
        }
    }
}
