//! `--device cpu|cuda[:N]`.

use anyhow::{Result, bail};
use burn::prelude::Device;

/// Parses a device name: `cpu` (the Flex CPU backend) or `cuda`, `cuda:N` (needs the `cuda`
/// feature).
pub fn parse_device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::flex()),
        _ if name == "cuda" || name.starts_with("cuda:") => cuda(name),
        other => bail!("unknown device {other:?}: expected cpu, cuda or cuda:N"),
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
