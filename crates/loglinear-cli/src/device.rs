//! `--device cpu|cuda[:N]|wgpu`, and for sweeps and data-parallel training a comma-separated
//! list of them.

use anyhow::{Result, bail};
use burn::prelude::Device;

use crate::data_parallel::GradSync;

/// Parses a device name: `cpu` (the Flex CPU backend), `cuda`, `cuda:N` (needs the `cuda`
/// feature) or `wgpu` (the default WGPU adapter; needs the `wgpu` feature; meant for testing the
/// fused kernels on machines without CUDA, e.g. with the software Vulkan driver lavapipe).
pub fn parse_device(name: &str) -> Result<Device> {
    if name.contains(',') {
        bail!(
            "--device {name:?} names several devices, and this command runs on one: only `sweep` \
             (one process per device) and `train` (data-parallel) take several"
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
        // `cuda` is `cuda:0`.
        let same = |other: &String| {
            let index = |n: &str| {
                if n == "cuda" {
                    "cuda:0".to_string()
                } else {
                    n.to_string()
                }
            };
            index(other) == index(name)
        };
        if name != "cpu" && list[..i].iter().any(same) {
            bail!("--device {names:?} names {name:?} twice");
        }
    }
    for name in &list {
        parse_device(name)?;
    }
    Ok(list)
}

/// The devices of a data-parallel run (`train --device cuda:0,cuda:1`), the first holding the
/// primary replica, and how their gradients are summed ([`GradSync::for_devices`]: NCCL on
/// CUDA, which is checked here). One name gives one device and no sync.
pub fn training_devices(names: &str) -> Result<(Vec<Device>, GradSync)> {
    let list = device_list(names)?;
    let sync = GradSync::for_devices(&list)?;
    let devices = list
        .iter()
        .map(|n| parse_device(n))
        .collect::<Result<_>>()?;
    Ok((devices, sync))
}

/// Errors unless NCCL's library loads under one of the names cudarc (and so cubecl-cuda's
/// collectives) will look for; the error says how to provide it.
#[cfg(feature = "cuda")]
pub fn require_nccl() -> Result<()> {
    let names = cudarc::get_lib_name_candidates("nccl");
    for name in &names {
        let c = std::ffi::CString::new(name.as_str()).expect("a library name without NUL");
        // SAFETY: dlopen with a valid C string; the handle is closed at once (the library stays
        // loaded only if something else holds it).
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            unsafe { libc::dlclose(handle) };
            return Ok(());
        }
    }
    bail!(
        "data-parallel training on CUDA devices all-reduces gradients with NCCL, and no NCCL \
         library was found (looked for {}; NCCL's own file is libnccl.so.2, which cudarc does \
         not try): `source scripts/nccl-env.sh` links one it finds (e.g. PyTorch's) as \
         libnccl.so and puts it on LD_LIBRARY_PATH",
        names.join(", ")
    )
}

/// Without CUDA there are no NCCL collectives.
#[cfg(not(feature = "cuda"))]
pub fn require_nccl() -> Result<()> {
    bail!(
        "NCCL collectives need a build with CUDA support (`--features cuda`, scripts/build-gpu.sh)"
    )
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
        assert!(
            err("cuda,cuda:0").contains("twice"),
            "{}",
            err("cuda,cuda:0")
        );
        // One-device commands refuse a list with the reason.
        let one = parse_device("cpu,cpu").unwrap_err().to_string();
        assert!(one.contains("only `sweep`"), "{one}");
        let (devices, sync) = training_devices("cpu,cpu").unwrap();
        assert_eq!((devices.len(), sync), (2, GradSync::Host));
        let (devices, sync) = training_devices("cpu").unwrap();
        assert_eq!((devices.len(), sync), (1, GradSync::None));
    }
}
