//! `--device cpu|cuda[:N]|wgpu`.

use anyhow::{Result, bail};
use burn::prelude::Device;

/// Parses a device name: `cpu` (the Flex CPU backend), `cuda`, `cuda:N` (needs the `cuda`
/// feature) or `wgpu` (the default WGPU adapter; needs the `wgpu` feature; meant for testing the
/// fused kernels on machines without CUDA, e.g. with the software Vulkan driver lavapipe).
pub fn parse_device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::flex()),
        _ if name == "cuda" || name.starts_with("cuda:") => cuda(name),
        "wgpu" => wgpu(),
        other => bail!("unknown device {other:?}: expected cpu, cuda, cuda:N or wgpu"),
    }
}

#[cfg(feature = "cuda")]
fn cuda(name: &str) -> Result<Device> {
    let index = match name.strip_prefix("cuda:") {
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| anyhow::anyhow!("bad CUDA device index in {name:?}"))?,
        None => 0,
    };
    Ok(Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda(name: &str) -> Result<Device> {
    bail!(
        "device {name:?} needs a build with CUDA support: build with `--features cuda` \
         (see scripts/build-gpu.sh)"
    )
}

#[cfg(feature = "wgpu")]
fn wgpu() -> Result<Device> {
    Ok(Device::wgpu(Default::default()))
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() -> Result<Device> {
    bail!("device \"wgpu\" needs a build with `--features wgpu`")
}
