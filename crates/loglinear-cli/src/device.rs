//! `--device cpu|cuda[:N]|wgpu`, and for sweeps a comma-separated list of them.

use anyhow::{Result, bail};
use burn::prelude::Device;

/// Parses a device name: `cpu` (the Flex CPU backend), `cuda`, `cuda:N` (needs the `cuda`
/// feature) or `wgpu` (the default WGPU adapter; needs the `wgpu` feature; meant for testing the
/// fused kernels on machines without CUDA, e.g. with the software Vulkan driver lavapipe).
pub fn parse_device(name: &str) -> Result<Device> {
    if name.contains(',') {
        bail!(
            "--device {name:?} names several devices, and this command runs on one: only `sweep` \
             spreads its runs over several (one process per device); data-parallel training of \
             one run is not built yet"
        );
    }
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

/// The devices of a comma-separated `--device` list (`cuda:0,cuda:1`), each checked as
/// [`parse_device`] would; a single name gives one. Errors on an empty entry or a device named
/// twice (two processes would then share it unknowingly).
pub fn device_list(names: &str) -> Result<Vec<String>> {
    let list: Vec<String> = names.split(',').map(|n| n.trim().to_string()).collect();
    for (i, name) in list.iter().enumerate() {
        if name.is_empty() {
            bail!("--device {names:?}: entry {} is empty", i + 1);
        }
        // `cpu` may repeat: the CPU backend has no device index, and two CPU processes are
        // how a sweep over "cpu,cpu" runs two at a time.
        if name != "cpu" && list[..i].contains(name) {
            bail!("--device {names:?} names {name:?} twice");
        }
    }
    for name in &list {
        parse_device(name)?;
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_are_checked() {
        assert_eq!(device_list("cpu").unwrap(), ["cpu"]);
        assert_eq!(device_list("cpu, cpu").unwrap(), ["cpu", "cpu"]);
        let err = |names: &str| device_list(names).unwrap_err().to_string();
        assert!(
            err("cpu,,cpu").contains("entry 2 is empty"),
            "{}",
            err("cpu,,cpu")
        );
        assert!(
            err("cuda:1,cuda:1").contains("names \"cuda:1\" twice"),
            "{}",
            err("cuda:1,cuda:1")
        );
        assert!(err("cpu,tpu").contains("unknown device \"tpu\""));
        // One-device commands refuse a list with the reason.
        let one = parse_device("cpu,cpu").unwrap_err().to_string();
        assert!(one.contains("only `sweep` spreads its runs"), "{one}");
    }
}
