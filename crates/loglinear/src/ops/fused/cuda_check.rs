//! The tensor-core kernels compiled to CUDA C++ for an sm_90 card (H100, H200) on a machine
//! without one: CubeCL expands each kernel with the device properties the CUDA runtime would
//! report for that card, runs its IR verifier and writes the CUDA C++ that NVRTC would compile.
//!
//! Why: the tensor-core kernels only compile where bf16 `mma.sync` exists, so software Vulkan
//! (the CPU machine's tests) never compiles them, and a kernel that CubeCL's verifier rejects
//! used to be found only on the GPU machine — a whole device call lost (session 37's v31x, run in
//! session 38: `Expected operand type cube.ptr, but found builtin.integer`). This check needs the
//! CUDA build's crates (feature `cublas`), no driver and no card; NVRTC itself (register
//! allocation, PTX) still runs only on the GPU machine.
//!
//! The properties follow `cubecl-cuda` 0.11.3's `DeviceService::init` for compute capability
//! 9.0 (the features the kernels can reach: supported types, `mma`/`ldmatrix`/`stmatrix`, plane
//! operations, barriers, asynchronous copies, memory reinterpretation and alignment), without its
//! driver queries; the hardware limits are the H100's and H200's.

use std::sync::Arc;

use cubecl::define_kernel;
use cubecl::features::Plane;
use cubecl::ir::{
    DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, OpaqueType,
};
use cubecl::prelude::*;
use cubecl_common::device::{DeviceId, ServiceId};
use cubecl_common::profile::TimingMethod;
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaCmmaCompiler;
use cubecl_cpp::shared::{register_mma_features, register_wmma_features};
use cubecl_cuda::{CudaCompilationOptions, CudaCompiler, CudaRuntime};
use cubecl_environment::stream::StreamId;
use cubecl_runtime::compiler::Compiler;
use cubecl_runtime::runtime::Runtime;
use cubecl_runtime::server::Handle;

use super::cube::Geometry;
use super::launch::{Kernels, compact_levels, plan};
use super::tensor_core::causal_tc_kernel;
use super::tensor_core_backward::{anticausal_backward_tc_kernel, causal_backward_tc_kernel};
use crate::fenwick::{bitlen, num_levels};

/// Compute capability of the cards the kernels are tuned for (H100, H200).
const SM90: u32 = 90;

/// The properties the CUDA runtime reports for an sm_90 card, and the compiler options it
/// compiles with.
fn sm90() -> (DeviceProperties, CudaCompilationOptions) {
    let arch = CudaArchitecture {
        version: SM90,
        tensor_cores: true,
    };
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        // Opt-in shared memory per block of an H100 / H200.
        max_shared_memory_size: 232_448,
        max_cube_count: (i32::MAX as u32, 65_535, 65_535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_cpu_cores: None,
        last_level_cache_size: None,
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: Some(8),
        max_vector_size: cubecl::ir::VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let memory = MemoryDeviceProperties::new(1 << 34, 512);
    let mut props = DeviceProperties::new(
        Default::default(),
        memory,
        hardware,
        TimingMethod::Device,
        DeviceIdentity {
            name: "sm_90 (compile check, no device)".into(),
            fingerprint: format!("ptx_sm{SM90}"),
            physical: None,
        },
    );
    cubecl_cpp::register_supported_types(&mut props);
    props.register_opaque_type(OpaqueType::Barrier);
    props.features.plane.insert(Plane::Sync);
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::NonUniformControlFlow);
    for elem in [FloatKind::F16, FloatKind::BF16] {
        props.features.matmul.ldmatrix.insert(ElemType::Float(elem));
        props.features.matmul.stmatrix.insert(ElemType::Float(elem));
    }
    props.features.copy_async = true;
    props.features.memory_reinterpret = true;
    props.features.alignment = true;
    props.features.device_memory_scope = true;
    register_wmma_features(
        CudaCmmaCompiler::Cpp.supported_cmma_combinations(&arch),
        &mut props,
    );
    register_mma_features(
        cubecl_cpp::cuda::supported_mma_combinations(&arch),
        &mut props,
    );
    let mut options = CudaCompilationOptions::default();
    options.cpp.supports_features.fast_math = true;
    options.cpp.supports_features.grid_constants = true;
    options.cpp.supports_features.elect_sync = true;
    options.cpp.supports_features.clusters = true;
    options.cpp.warp_size = 32;
    (props, options)
}

/// A tensor argument of `len` elements: a dummy kernel registers it and never reads it.
fn dummy_tensor(len: usize) -> TensorArg {
    let service = ServiceId::of::<CudaRuntime>(DeviceId {
        type_id: 0,
        index_id: 0,
    });
    let handle = Handle::new(service, StreamId { value: 0 }, (len * 4) as u64);
    let shape = [len];
    TensorArg::Handle {
        handle: TensorBinding {
            handle: handle.binding(),
            strides: [1usize].into(),
            shape: shape.into(),
            tiling: Default::default(),
        },
    }
}

/// Which kernel [`compile_tensor_core_kernel`] compiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TensorCoreKernel {
    /// `causal_tc_kernel` (the forward).
    Forward,
    /// `causal_tc_kernel` with `single` (Mamba-2).
    Mamba2,
    /// `causal_backward_tc_kernel` (dq, dλ).
    CausalBackward,
    /// `anticausal_backward_tc_kernel` (dk, dv).
    AnticausalBackward,
}

/// The CUDA C++ of `kernel` with bf16 inputs and f32 decays, for `geo` and input loads of
/// `vector` elements, as the CUDA runtime would hand it to NVRTC on a card with `props`; `Err`
/// with CubeCL's message where the kernel fails to expand (`define_kernel` turns its panic into
/// an error) or the IR verifier rejects it.
fn compile_tensor_core_kernel(
    kernel: TensorCoreKernel,
    geo: Geometry,
    vector: usize,
    props: &Arc<DeviceProperties>,
    options: &CudaCompilationOptions,
) -> Result<String, String> {
    let target = Arc::new(CudaRuntime::target_properties());
    let bf16 = ElemType::Float(FloatKind::BF16);
    let f32_ = ElemType::Float(FloatKind::F32);
    let cubes = CubeCount::Static(4, 1, 1);
    let units = CubeDim::new_1d(geo.threads as u32);
    let t = || dummy_tensor(1 << 16);
    let (batch, seq, heads, width, segments, seg_chunks) = (1, 256, 2, geo.pt, 1, 4);
    // The two backward kernels take the same arguments (as their launches in `launch.rs`).
    macro_rules! backward {
        ($kernel:ident) => {
            define_kernel(&$kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                cubes.clone(),
                units,
                vector,
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                batch,
                seq,
                heads,
                width,
                segments,
                seg_chunks,
                geo,
                [bf16, f32_, bf16],
            ))
        };
    }
    let definition = match kernel {
        TensorCoreKernel::Forward | TensorCoreKernel::Mamba2 => {
            define_kernel(&causal_tc_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                cubes.clone(),
                units,
                vector,
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                t(),
                batch,
                seq,
                heads,
                width,
                segments,
                seg_chunks,
                geo,
                kernel == TensorCoreKernel::Mamba2,
                [bf16, f32_],
            ))
        }
        TensorCoreKernel::CausalBackward => backward!(causal_backward_tc_kernel),
        TensorCoreKernel::AnticausalBackward => backward!(anticausal_backward_tc_kernel),
    }
    .map_err(|error| format!("{error:?}"))?;
    CudaCompiler::default()
        .compile(definition, options)
        .map(|source| source.to_string())
        .map_err(|error| format!("{error:?}"))
}

/// Every tensor-core kernel the planner would launch on an H100 / H200 for key width `nk`, value
/// width `width` over `t` tokens in `rows` sequences·heads walked whole (forward, Mamba-2, causal
/// and anticausal backward), compiled to CUDA C++: each kernel's name and source, or the first
/// kernel's failure (which kernel, its geometry, CubeCL's message).
pub fn compile_for_sm90(
    nk: usize,
    width: usize,
    t: usize,
    rows: usize,
) -> Result<Vec<(String, String)>, String> {
    let (props, options) = sm90();
    let props = Arc::new(props);
    let max_shared = props.hardware.max_shared_memory_size;
    let sms = props.hardware.num_streaming_multiprocessors.unwrap_or(1) as usize;
    let levels = num_levels(t);
    // The widest 16-byte (or narrower) vector of bf16 that divides both widths, as `vector_size`.
    let vector = [8, 4, 2, 1]
        .into_iter()
        .find(|n| nk.is_multiple_of(*n) && width.is_multiple_of(*n))
        .unwrap_or(1);
    let mut sources = Vec::new();
    for (kernels, which) in [
        (
            Kernels::TensorCoreForward,
            &[TensorCoreKernel::Forward, TensorCoreKernel::Mamba2][..],
        ),
        (
            Kernels::TensorCoreBackward,
            &[
                TensorCoreKernel::CausalBackward,
                TensorCoreKernel::AnticausalBackward,
            ][..],
        ),
    ] {
        let plan = plan(kernels, nk, width, levels, t, max_shared, Some((rows, sms)))
            .ok_or_else(|| format!("{kernels:?}: no tile fits (N {nk}, P {width}, T {t})"))?;
        let nlev = bitlen(t.div_ceil(plan.chunk) - 1);
        for &kernel in which {
            let nlev = if kernel == TensorCoreKernel::Mamba2 {
                usize::from(t > plan.chunk)
            } else {
                nlev
            };
            // As `launch.rs` launches it in a whole walk (the backward kernels ignore the flag).
            let forward = matches!(kernel, TensorCoreKernel::Forward | TensorCoreKernel::Mamba2);
            let geo = Geometry {
                compact_levels: forward
                    && compact_levels(true, kernel == TensorCoreKernel::Mamba2, 1),
                ..plan.geometry(nk, width, levels, nlev)
            };
            let source = compile_tensor_core_kernel(kernel, geo, vector, &props, &options)
                .map_err(|why| format!("{kernel:?} with {geo:?}: {why}"))?;
            sources.push((format!("{kernel:?}"), source));
        }
    }
    Ok(sources)
}
