//! The on-disk cache of compiled GPU kernels and autotune results (builds with `persistence`,
//! implied by `cuda`): without it every process spends its first minute compiling kernels.
//!
//! Location: `$LOGLINEAR_KERNEL_CACHE` if set, else `$XDG_CACHE_HOME/loglinear/kernels`, else
//! `~/.cache/loglinear/kernels`. Clear it with `rm -rf` of that directory (it is rebuilt on
//! demand). A `cubecl.toml` or `burn.toml` in the working directory or above takes precedence
//! and is used as written.

use std::path::PathBuf;

/// The cache directory (see the module docs).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOGLINEAR_KERNEL_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("loglinear").join("kernels")
}

/// Whether a CubeCL configuration file applies to this process.
fn user_config_exists() -> bool {
    let Ok(mut dir) = std::env::current_dir() else {
        return false;
    };
    loop {
        for name in ["cubecl.toml", "CubeCL.toml", "burn.toml", "Burn.toml"] {
            if dir.join(name).is_file() {
                return true;
            }
        }
        if !dir.pop() {
            return false;
        }
    }
}

/// Turns the persistent cache on (before any device is opened); a no-op when a user
/// configuration file exists or the configuration was already read.
#[cfg(feature = "persistence")]
pub fn enable() {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    if user_config_exists() {
        return;
    }
    let mut config = CubeClRuntimeConfig::default();
    config.compilation.cache = true;
    config.environment.path = CacheConfig::Directory(cache_dir());
    let _ = CubeClRuntimeConfig::try_set(config);
}

/// Without `persistence` there is nothing to enable.
#[cfg(not(feature = "persistence"))]
pub fn enable() {
    let _ = user_config_exists;
}
