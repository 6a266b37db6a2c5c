//! [`GemmKernels::gemm`](super::gemm::GemmKernels::gemm) on CUDA devices by cuBLAS
//! (`cublasGemmStridedBatchedEx`), enqueued on the CUDA stream that CubeCL runs the thread's
//! kernels on, so that it is ordered with them like any kernel launch and nothing waits on the
//! host.
//!
//! The buffers' device addresses and stream come from `ComputeClient::get_resource`, which
//! first hands the device every operation queued before it; the stream field of the resource
//! is what the patched cubecl-cuda adds (scripts/patches). libcublas is loaded at run time
//! (from `LD_LIBRARY_PATH`, like libnvrtc); without it the products stay on CubeCL's kernels
//! and one line on stderr says so.
//!
//! Row-major `C = A·B` is column-major `Cᵀ = Bᵀ·Aᵀ`: cuBLAS gets B as its first operand. An
//! operand stored row-major (`[.., R, C]` with unit column stride) is, read column-major, its
//! own transpose; a transposed view (unit row stride) is the matrix itself. Either needs no
//! copy; anything else is made contiguous first. Half-precision operands accumulate in f32 and
//! f32 operands compute in full f32 (no TF32), so results match the CPU's to rounding.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use burn::tensor::DType;
use burn_cubecl::CubeDevice;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl_runtime::runtime::Runtime;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType,
};
use cudarc::driver::sys::{CUcontext, CUevent, CUevent_flags, CUstream};

use super::gemm::gemm_shape;

type CudaServer = <cubecl_cuda::CudaRuntime as Runtime>::Server;

/// How one operand is laid out for cuBLAS: its operation, leading dimension and batch stride
/// (0 where its batch of 1 is broadcast), all in elements.
struct Operand {
    tensor: CubeTensor,
    op: cublasOperation_t,
    ld: i64,
    batch_stride: i64,
}

impl Operand {
    /// `t: [batch, rows, cols]` as cuBLAS reads it column-major: row-major storage is the
    /// transpose (`OP_N` gives `tᵀ`), a transposed view is `t` (`OP_T` gives `tᵀ`).
    fn new(t: CubeTensor) -> Self {
        let [batch, rows, cols] = t.meta.shape().dims::<3>();
        let layout = |t: &CubeTensor| {
            let s = t.meta.strides();
            let (s0, s1, s2) = (s[0] as i64, s[1] as i64, s[2] as i64);
            let untiled = t.meta.tiling == Default::default();
            let batch_stride = if batch == 1 { 0 } else { s0 };
            let fits = |x: i64| x <= i32::MAX as i64;
            if !untiled || (batch > 1 && s0 <= 0) || !fits(s1) || !fits(s2) {
                None
            } else if (s2 == 1 || cols == 1) && s1 >= cols.max(1) as i64 {
                Some((cublasOperation_t::CUBLAS_OP_N, s1, batch_stride))
            } else if (s1 == 1 || rows == 1) && s2 >= rows.max(1) as i64 {
                Some((cublasOperation_t::CUBLAS_OP_T, s2, batch_stride))
            } else {
                None
            }
        };
        let (t, (op, ld, batch_stride)) = match layout(&t) {
            Some(l) => (t, l),
            None => {
                note_copy(&t);
                let t = into_contiguous(t);
                let l = layout(&t).expect("a contiguous tensor is row-major");
                (t, l)
            }
        };
        Self {
            tensor: t,
            op,
            ld,
            batch_stride,
        }
    }
}

/// The per-thread cuBLAS handle of each CUDA device (handles are not shared across threads).
struct Handles {
    by_device: HashMap<usize, (CUcontext, cublasHandle_t)>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::new(Handles { by_device: HashMap::new() });
}

/// Whether libcublas could be loaded (checked once; a line on stderr when it could not).
fn cublas_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: only tries to open the library.
        let present = unsafe { cudarc::cublas::sys::is_culib_present() };
        if !present {
            eprintln!(
                "loglinear: libcublas not found (put the CUDA libraries, e.g. \
                 /usr/local/cuda/lib64, on LD_LIBRARY_PATH); matrix products run on CubeCL's \
                 kernels instead"
            );
        }
        present
    })
}

/// `a · b` by cuBLAS on a CUDA device, or the operands back where cuBLAS does not take them
/// (another runtime, a dtype other than f32/bf16/f16, mixed dtypes, empty or oversized
/// dimensions, no libcublas).
pub(crate) fn gemm(a: CubeTensor, b: CubeTensor) -> Result<CubeTensor, (CubeTensor, CubeTensor)> {
    let CubeDevice::Cuda(device) = &a.device else {
        return Err((a, b));
    };
    let index = device.index;
    let data_type = match a.dtype {
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        DType::F16 => cudaDataType::CUDA_R_16F,
        _ => return Err((a, b)),
    };
    let shape = gemm_shape(a.meta.shape(), b.meta.shape());
    let [batch, m, n] = shape.dims::<3>();
    let k = a.meta.shape()[2];
    let fits = |x: usize| x > 0 && x <= i32::MAX as usize;
    if b.dtype != a.dtype || !(fits(batch) && fits(m) && fits(n) && fits(k)) || !cublas_present() {
        return Err((a, b));
    }
    let (client, device) = (a.client.clone(), a.device.clone());
    let (a, b) = (Operand::new(a), Operand::new(b));
    // The device's own layout for a new tensor, as every Burn op's output has it: on CUDA, rows
    // whose bytes are not a multiple of the alignment are pitched (padded). Both the products
    // (leading dimensions) and the loss kernels read such rows in place. (What made the LM
    // head's products slow was not the pitch but the odd row length of 50,257 — the head now
    // runs over a padded vocabulary, `nn::init::vocab_logits`.)
    let c = empty_device_dtype(client.clone(), device, shape, a.tensor.dtype);
    let (ldc, c_batch_stride) = {
        let s = c.meta.strides();
        (s[1].max(n) as i64, s[0] as i64)
    };
    // A weight shared by the batch (b's batch stride 0) times a row-major `a` whose batches
    // follow each other row after row is one product over all the batch's rows: one large GEMM
    // instead of `batch` small ones (`c`'s rows follow each other at one pitch likewise).
    let flat = batch > 1
        && b.batch_stride == 0
        && a.op == cublasOperation_t::CUBLAS_OP_N
        && a.batch_stride == m as i64 * a.ld
        && c_batch_stride == m as i64 * ldc
        && fits(batch * m);
    let (batch, m) = if flat { (1, batch * m) } else { (batch, m) };
    let resource = |t: &CubeTensor| {
        client
            .get_resource::<CudaServer>(t.handle.clone())
            .unwrap_or_else(|e| panic!("gemm: the CUDA buffer of an operand: {e:?}"))
    };
    let (ra, rb, rc) = (resource(&a.tensor), resource(&b.tensor), resource(&c));
    let stream: CUstream = rc.resource().stream;
    assert!(
        !stream.is_null(),
        "gemm: the CUDA buffer carries no stream (cubecl-cuda without the patch of scripts/patches)"
    );
    let (alpha, beta) = (1.0f32, 0.0f32);
    HANDLES.with_borrow_mut(|handles| {
        let (ctx, handle) = *handles.by_device.entry(index).or_insert_with(|| {
            // SAFETY: the device exists (CubeCL runs on it); the primary context is the one
            // CubeCL retains and makes current on its threads.
            unsafe {
                let dev =
                    cudarc::driver::result::device::get(index as i32).expect("gemm: cuDeviceGet");
                let ctx = cudarc::driver::result::primary_ctx::retain(dev)
                    .expect("gemm: cuDevicePrimaryCtxRetain");
                cudarc::driver::result::ctx::set_current(ctx).expect("gemm: cuCtxSetCurrent");
                let handle = cudarc::cublas::result::create_handle().expect("gemm: cublasCreate");
                (ctx, handle)
            }
        });
        // SAFETY: the pointers are live allocations of the resources held until the call has
        // been enqueued (later reuse of their memory is ordered after it on the same stream);
        // the dimensions, leading dimensions and strides describe the views checked above.
        unsafe {
            cudarc::driver::result::ctx::set_current(ctx).expect("gemm: cuCtxSetCurrent");
            cudarc::cublas::result::set_stream(handle, stream as *mut _)
                .expect("gemm: cublasSetStream");
            // The product in row-major terms; ᵀ marks an operand read from a transposed view.
            let label = || {
                let view = |o: cublasOperation_t| match o {
                    cublasOperation_t::CUBLAS_OP_T => "ᵀ",
                    _ => "",
                };
                let shape = format!(
                    "{batch} × [{m}×{k}]{} · [{k}×{n}]{} {:?}",
                    view(a.op),
                    view(b.op),
                    a.tensor.dtype
                );
                (shape, 2.0 * (batch * m * n * k) as f64)
            };
            timed(stream, label, || {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    handle,
                    b.op,
                    a.op,
                    n as i32,
                    m as i32,
                    k as i32,
                    (&alpha as *const f32).cast::<c_void>(),
                    rb.resource().ptr as *const c_void,
                    data_type,
                    b.ld as i32,
                    b.batch_stride,
                    ra.resource().ptr as *const c_void,
                    data_type,
                    a.ld as i32,
                    a.batch_stride,
                    (&beta as *const f32).cast::<c_void>(),
                    rc.resource().ptr as *mut c_void,
                    data_type,
                    ldc as i32,
                    c_batch_stride,
                    batch as i32,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .unwrap_or_else(|e| {
                    panic!("gemm: cublasGemmStridedBatchedEx ({batch} × {m}×{k} · {k}×{n}): {e:?}")
                })
            });
        }
    });
    drop((ra, rb, rc));
    Ok(c)
}

/// cuBLAS calls bracketed by CUDA events while a profile runs ([`profile_start`] to
/// [`profile_finish`]): CubeCL's launch observer sees only CubeCL kernels.
struct Timings(Vec<(CUevent, CUevent, String, f64)>, Vec<String>);

// SAFETY: CUDA events are plain handles, valid on any thread of the process.
unsafe impl Send for Timings {}

static PROFILE: Mutex<Option<Timings>> = Mutex::new(None);

/// Starts timing every cuBLAS call of the process.
pub(crate) fn profile_start() {
    *PROFILE.lock().expect("gemm profile lock") = Some(Timings(Vec::new(), Vec::new()));
}

/// Stops timing and returns each call's product (shape, operations, dtype), its floating-point
/// operations and device milliseconds (waits for the calls to finish), and the operands that were copied to a layout
/// cuBLAS reads.
pub(crate) fn profile_finish() -> (Vec<(String, f64, f64)>, Vec<String>) {
    let Some(Timings(events, copies)) = PROFILE.lock().expect("gemm profile lock").take() else {
        return (Vec::new(), Vec::new());
    };
    let times = events
        .into_iter()
        .map(|(start, end, label, flops)| {
            // SAFETY: both events were created and recorded by `gemm` and are destroyed here once.
            unsafe {
                cudarc::driver::result::event::synchronize(end).expect("gemm: cuEventSynchronize");
                let ms = cudarc::driver::result::event::elapsed(start, end)
                    .expect("gemm: cuEventElapsedTime");
                cudarc::driver::result::event::destroy(start).ok();
                cudarc::driver::result::event::destroy(end).ok();
                (label, flops, f64::from(ms))
            }
        })
        .collect();
    (times, copies)
}

/// Two events recorded on `stream` around `call` when a profile runs; `call` alone otherwise.
fn timed(stream: CUstream, label: impl FnOnce() -> (String, f64), call: impl FnOnce()) {
    let mut profile = PROFILE.lock().expect("gemm profile lock");
    let Some(Timings(events, _)) = profile.as_mut() else {
        drop(profile);
        return call();
    };
    let event = || {
        cudarc::driver::result::event::create(CUevent_flags::CU_EVENT_DEFAULT)
            .expect("gemm: cuEventCreate")
    };
    let (start, end) = (event(), event());
    // SAFETY: fresh events recorded on the live stream the call is enqueued on.
    unsafe {
        cudarc::driver::result::event::record(start, stream).expect("gemm: cuEventRecord");
        call();
        cudarc::driver::result::event::record(end, stream).expect("gemm: cuEventRecord");
    }
    let (label, flops) = label();
    events.push((start, end, label, flops));
}

/// Records an operand that had to be copied to a layout cuBLAS reads (shape and strides), while
/// a profile runs.
fn note_copy(t: &CubeTensor) {
    if let Some(Timings(_, copies)) = PROFILE.lock().expect("gemm profile lock").as_mut() {
        copies.push(format!(
            "{:?} strides {:?} {:?}",
            t.meta.shape().as_slice(),
            t.meta.strides(),
            t.dtype
        ));
    }
}
