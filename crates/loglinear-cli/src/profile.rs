//! Where a GPU training step spends its time: every kernel launch of a few steps timed on the
//! device (CubeCL's launch observer; on CUDA two events per launch, read back only after the
//! steps, so kernels still run back to back), grouped by family, with the time the device sat
//! idle between kernels (launch overhead, host work, synchronisations).
//!
//! The markers cost the issuing thread a little per launch, so a profiled step is somewhat slower
//! than a plain one: the table gives device time per family and the plain step's wall time
//! beside it; what the device does not account for is host time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

// On native targets CubeCL's `Instant` is the standard library's.
use cubecl::logging::{
    Duration, LaunchObservation, LaunchObserver, ProfileDuration, TimingMethod, TimingRequest,
};
use std::time::Instant;

/// One launch's measurement as it arrives: unread (the normal case) or already a length.
enum Measured {
    Unread(ProfileDuration),
    Length(Duration),
}

#[derive(Default)]
struct Recorder {
    launches: Mutex<Vec<(&'static str, Measured)>>,
}

impl LaunchObserver for Recorder {
    fn launched(&self, _kernel: &'static str) {}

    fn timing(&self) -> TimingRequest {
        TimingRequest::Deferred
    }

    fn profiled(&self, kernel: &'static str, profile: ProfileDuration) {
        self.launches
            .lock()
            .expect("profile lock")
            .push((kernel, Measured::Unread(profile)));
    }

    fn timed(&self, kernel: &'static str, duration: Duration, _method: TimingMethod) {
        self.launches
            .lock()
            .expect("profile lock")
            .push((kernel, Measured::Length(duration)));
    }
}

/// Records every kernel launched while it lives.
pub struct KernelProfile {
    recorder: Arc<Recorder>,
    epoch: Instant,
    _observation: LaunchObservation,
}

/// One kernel family's share.
#[derive(Clone, Debug, Default)]
pub struct FamilyTime {
    /// Launches.
    pub launches: usize,
    /// Device milliseconds, summed over launches.
    pub ms: f64,
}

/// The result of a profiled region.
#[derive(Clone, Debug, Default)]
pub struct ProfileReport {
    /// Family → time, summed over the region.
    pub families: BTreeMap<&'static str, FamilyTime>,
    /// Kernel name (short) → its family (from the full name) and time, summed over the region.
    pub kernels: BTreeMap<String, (&'static str, FamilyTime)>,
    /// Device time of all kernels (ms).
    pub device_ms: f64,
    /// From the first kernel's start to the last kernel's end (ms); `None` where the backend
    /// gave lengths only.
    pub span_ms: Option<f64>,
    /// Operands of cuBLAS products that were copied to a layout cuBLAS reads (shape, strides).
    pub gemm_copies: Vec<String>,
    /// cuBLAS products by shape: calls, floating-point operations and device ms, summed.
    pub gemms: BTreeMap<String, (usize, f64, f64)>,
    /// Launches whose measurement came back empty.
    pub unmeasured: usize,
}

impl KernelProfile {
    /// Starts recording every launch of this process.
    pub fn start() -> Self {
        let recorder = Arc::new(Recorder::default());
        let observation = LaunchObservation::new(recorder.clone());
        // cuBLAS products are not CubeCL launches: they are timed by events of their own.
        #[cfg(feature = "kernels")]
        loglinear::kernels::gemm::profile_start();
        Self {
            recorder,
            epoch: Instant::now(),
            _observation: observation,
        }
    }

    /// Stops recording and reads every measurement back. Call after the device finished the
    /// region (`device.sync()`).
    pub fn finish(self) -> ProfileReport {
        let recorder = self.recorder.clone();
        let epoch = self.epoch;
        drop(self);
        let launches = std::mem::take(&mut *recorder.launches.lock().expect("profile lock"));
        let mut report = ProfileReport::default();
        let mut windows = Vec::new();
        for (kernel, measured) in launches {
            let ms = match measured {
                Measured::Length(d) => d.as_secs_f64() * 1e3,
                Measured::Unread(profile) => {
                    match cubecl::future::block_on(profile.resolve()) {
                        Some(ticks) => {
                            // Device windows on the host clock, from an instant taken before the
                            // region (a window placed before it would count from zero).
                            windows.push((
                                ticks.start_duration_since(epoch).as_secs_f64(),
                                ticks.end_duration_since(epoch).as_secs_f64(),
                            ));
                            ticks.duration().as_secs_f64() * 1e3
                        }
                        None => {
                            report.unmeasured += 1;
                            continue;
                        }
                    }
                }
            };
            report.device_ms += ms;
            let family = family(kernel);
            let f = report.families.entry(family).or_default();
            f.launches += 1;
            f.ms += ms;
            let (_, k) = report
                .kernels
                .entry(short_name(kernel))
                .or_insert((family, FamilyTime::default()));
            k.launches += 1;
            k.ms += ms;
        }
        #[cfg(feature = "kernels")]
        let (cublas_ms, copies) = loglinear::kernels::gemm::profile_finish();
        #[cfg(not(feature = "kernels"))]
        let (cublas_ms, copies): (Vec<(String, f64, f64)>, Vec<String>) = (Vec::new(), Vec::new());
        for (shape, flops, ms) in cublas_ms {
            report.device_ms += ms;
            let family = "matmul (cuBLAS)";
            let f = report.families.entry(family).or_default();
            f.launches += 1;
            f.ms += ms;
            let (_, k) = report
                .kernels
                .entry("cublasGemmStridedBatchedEx".to_string())
                .or_insert((family, FamilyTime::default()));
            k.launches += 1;
            k.ms += ms;
            let g = report.gemms.entry(shape).or_default();
            g.0 += 1;
            g.1 += flops;
            g.2 += ms;
        }
        report.gemm_copies = copies;
        if !windows.is_empty() {
            let first = windows.iter().map(|w| w.0).fold(f64::INFINITY, f64::min);
            let last = windows
                .iter()
                .map(|w| w.1)
                .fold(f64::NEG_INFINITY, f64::max);
            report.span_ms = Some((last - first) * 1e3);
        }
        report
    }
}

/// The kernel's name without its module path and generic arguments.
pub fn short_name(kernel: &str) -> String {
    let base = kernel.split('<').next().unwrap_or(kernel);
    let tail = base.rsplit("::").next().unwrap_or(base);
    let generics = kernel.find('<').map(|i| &kernel[i..]).unwrap_or("");
    let generics: String = generics.chars().take(60).collect();
    format!("{tail}{generics}")
}

/// The family a kernel belongs to, from its full (type) name. The words are kernel and module
/// names, not crate names: the cross-entropy kernels live in the `loglinear` crate too.
pub fn family(kernel: &str) -> &'static str {
    let k = kernel.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| k.contains(w));
    if has(&["cross_entropy", "ceforward", "cebackward"]) {
        "softmax cross-entropy (fused kernels)"
    } else if has(&["causal_softmax", "causalsoftmax"]) {
        // Before the log-linear op's `causal` kernels: the Transformer's attention softmax.
        "attention softmax (fused kernels)"
    } else if has(&["causal", "tensor_core", "mamba2"]) {
        "log-linear op (fused kernels)"
    } else if has(&["matmul", "gemm", "cmma", "mma"]) {
        "matmul"
    } else if has(&["conv"]) {
        "conv"
    } else if has(&["softmax"]) {
        "softmax"
    } else if has(&["cumsum", "scan", "prefix"]) {
        "scans (cumsum)"
    } else if has(&["reduce", "sum", "mean", "argmax", "max", "min", "norm"]) {
        "reductions"
    } else if has(&["gather", "scatter", "select", "embedding", "index"]) {
        "gather / scatter"
    } else if has(&["elemwise", "fuse", "trace", "block"]) {
        "fused element-wise"
    } else if has(&["cast"]) {
        "casts"
    } else if has(&[
        "copy",
        "contiguous",
        "slice",
        "cat",
        "permute",
        "transpose",
        "reshape",
    ]) {
        "copies / layout"
    } else if has(&["random", "fill", "zeros", "ones", "arange"]) {
        "fills"
    } else {
        "other"
    }
}

impl ProfileReport {
    /// A markdown table per step: family, launches, device ms, share of the wall step; then the
    /// `top` most expensive kernels; then device busy vs idle.
    pub fn table(&self, steps: usize, wall_step_ms: f64, top: usize) -> String {
        let per = |x: f64| x / steps.max(1) as f64;
        let mut families: Vec<_> = self.families.iter().collect();
        families.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
        let mut out = format!(
            "\nprofile of {steps} steps (device time per step; plain step {wall_step_ms:.1} ms):\n\n\
             | kernel family | launches/step | device ms/step | % of plain step |\n|---|---|---|---|\n"
        );
        for (name, f) in &families {
            out += &format!(
                "| {name} | {:.0} | {:.2} | {:.1} % |\n",
                per(f.launches as f64),
                per(f.ms),
                100.0 * per(f.ms) / wall_step_ms
            );
        }
        let device = per(self.device_ms);
        out += &format!(
            "| **all kernels** | {:.0} | {device:.2} | {:.1} % |\n",
            per(self.families.values().map(|f| f.launches as f64).sum()),
            100.0 * device / wall_step_ms
        );
        out += &format!(
            "| **not on the device** (plain step − kernels: launch gaps, host work, syncs) | | {:.2} | {:.1} % |\n",
            wall_step_ms - device,
            100.0 * (wall_step_ms - device) / wall_step_ms
        );
        if !self.gemms.is_empty() {
            let mut gemms: Vec<_> = self.gemms.iter().collect();
            gemms.sort_by(|a, b| b.1.2.total_cmp(&a.1.2));
            out += "\ncuBLAS products by shape (row-major; ᵀ: read from a transposed view):\n\n\
                    | product | calls/step | device ms/step | TFLOP/s |\n|---|---|---|---|\n";
            for (shape, (calls, flops, ms)) in gemms {
                out += &format!(
                    "| {shape} | {:.0} | {:.3} | {:.0} |\n",
                    per(*calls as f64),
                    per(*ms),
                    flops / (ms * 1e9)
                );
            }
        }
        if !self.gemm_copies.is_empty() {
            let mut distinct = self.gemm_copies.clone();
            distinct.sort();
            distinct.dedup();
            out += &format!(
                "\n{:.0} operand copies per step before cuBLAS products: {}\n",
                per(self.gemm_copies.len() as f64),
                distinct.join("; ")
            );
        }
        // cuBLAS time is measured apart from CubeCL's windows: the span then leaves it out.
        if let (Some(span), false) = (self.span_ms, self.gemms.is_empty()) {
            out += &format!(
                "\nprofiled span of the CubeCL kernels {:.2} ms/step (cuBLAS products are timed \
                 apart and not placed in it)\n",
                per(span)
            );
        } else if let Some(span) = self.span_ms {
            out += &format!(
                "\nprofiled span {:.2} ms/step from the first kernel's start to the last one's end, \
                 of which the device was idle {:.2} ms/step\n",
                per(span),
                per(span) - device
            );
        }
        if self.unmeasured > 0 {
            out += &format!(
                "({} launches came back without a measurement)\n",
                self.unmeasured
            );
        }
        let mut kernels: Vec<_> = self.kernels.iter().collect();
        kernels.sort_by(|a, b| b.1.1.ms.total_cmp(&a.1.1.ms));
        out += &format!(
            "\ntop {top} kernels:\n\n| kernel | family | launches/step | device ms/step |\n|---|---|---|---|\n"
        );
        for (name, (family, k)) in kernels.iter().take(top) {
            out += &format!(
                "| `{name}` | {family} | {:.0} | {:.3} |\n",
                per(k.launches as f64),
                per(k.ms)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_of_typical_kernel_names() {
        assert_eq!(
            family("loglinear::ops::fused::tensor_core::causal_tc_kernel<f32>"),
            "log-linear op (fused kernels)"
        );
        assert_eq!(
            family("cubek_matmul::kernels::layered::MatmulKernel"),
            "matmul"
        );
        assert_eq!(
            family("burn_cubecl::kernel::reduce::ReduceKernel"),
            "reductions"
        );
        assert_eq!(
            family("loglinear::kernels::cross_entropy::CeBackwardKernel<bf16, i64>"),
            "softmax cross-entropy (fused kernels)"
        );
        assert_eq!(
            family("loglinear::ops::fused::backward::AnticausalBackwardKernel<f32, f32>"),
            "log-linear op (fused kernels)"
        );
        assert_eq!(
            family("loglinear::kernels::attention::CausalSoftmaxBackwardKernel<bf16>"),
            "attention softmax (fused kernels)"
        );
        assert_eq!(family("something_unknown"), "other");
        assert_eq!(short_name("a::b::c<d::e>"), "c<d::e>");
    }
}
