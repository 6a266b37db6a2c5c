//! CubeCL's run-time settings for GPU runs: the on-disk cache of compiled kernels (builds with
//! `persistence`, implied by `cuda`; without it every process spends its first minute compiling
//! kernels) and the autotune level.
//!
//! Autotune results are kept in memory only, each process tuning the operations it runs (a few
//! seconds); the on-disk autotune cache is off. Why: CubeCL keys a decision by a bucket of
//! shapes, so a decision stored by one workload is served to another whose shapes fall into the
//! same bucket without being tuned for them. Measured on the H200 (bench/RESULTS.md, session 12):
//! with a cache that MQAR sweeps had filled, the D = 512 LM step took 93.1 ms (its 108 Burn
//! reductions 36.8 ms); tuned in its own process, 75.7 ms (16.9 ms). With that cache the
//! Transformer's reductions took 109 ms against 18 ms in an earlier session (most likely the same
//! cause). A `cubecl.toml` (below) can still turn it on.
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

/// The autotune level of GPU runs: `$LOGLINEAR_AUTOTUNE_LEVEL` (minimal, balanced, extensive,
/// full) if set, else [`DEFAULT_AUTOTUNE_LEVEL`].
#[cfg(feature = "persistence")]
fn autotune_level() -> cubecl::config::autotune::AutotuneLevel {
    use cubecl::config::autotune::AutotuneLevel;
    let parse = |name: &str| match name {
        "minimal" => Some(AutotuneLevel::Minimal),
        "balanced" => Some(AutotuneLevel::Balanced),
        "extensive" => Some(AutotuneLevel::Extensive),
        "full" => Some(AutotuneLevel::Full),
        _ => None,
    };
    let default = parse(DEFAULT_AUTOTUNE_LEVEL).expect("a valid default level");
    match std::env::var("LOGLINEAR_AUTOTUNE_LEVEL") {
        Err(_) => default,
        Ok(name) => parse(&name).unwrap_or_else(|| {
            eprintln!(
                "warning: LOGLINEAR_AUTOTUNE_LEVEL={name:?} is not one of minimal, balanced, \
                 extensive, full; using {DEFAULT_AUTOTUNE_LEVEL}"
            );
            default
        }),
    }
}

/// Autotune level when none is asked for. Measured on the H200 (bench/RESULTS.md, session 5):
/// with `minimal` the LM step takes 198.6 ms once tuned, and a cold process still spends more
/// than 7 minutes compiling and tuning before its first step; `balanced` tunes more candidates
/// per operation (≈ 6 minutes for the matmuls alone before fusion was on) and was not measured
/// faster, so the cheaper level is the default.
pub const DEFAULT_AUTOTUNE_LEVEL: &str = "minimal";

/// Configures CubeCL before any device is opened: the persistent cache of compiled kernels and
/// autotune results, the autotune level, and one stderr line per tuned operation (what was tuned
/// and the winner), so a cold first run shows why it waits. `CUBECL_*` environment variables
/// still apply. A no-op when a user configuration file exists or the configuration was already
/// read.
#[cfg(feature = "persistence")]
pub fn enable() {
    use cubecl::config::autotune::AutotuneLogLevel;
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    if user_config_exists() {
        return;
    }
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.compilation.cache = true;
    config.environment.path = CacheConfig::Directory(cache_dir());
    config.autotune.level = autotune_level();
    // Decisions stored by one workload mislead another (module docs).
    config.autotune.disable_cache = true;
    if std::env::var_os("CUBECL_DEBUG_LOG").is_none()
        && std::env::var("LOGLINEAR_AUTOTUNE_LOG").map_or(true, |v| v != "0")
    {
        config.autotune.logger.level = AutotuneLogLevel::Minimal;
        config.autotune.logger.stderr = true;
    }
    // `LOGLINEAR_COMPILE_LOG=stderr|FILE`: one line per kernel compiled (not served by the
    // cache), to count what a cold process compiles.
    if let Ok(target) = std::env::var("LOGLINEAR_COMPILE_LOG") {
        use cubecl::config::compilation::CompilationLogLevel;
        config.compilation.logger.level = CompilationLogLevel::Basic;
        match target.as_str() {
            "stderr" => config.compilation.logger.stderr = true,
            file => config.compilation.logger.file = Some(file.into()),
        }
    }
    let _ = CubeClRuntimeConfig::try_set(config);
}

/// Without `persistence` there is nothing to enable.
#[cfg(not(feature = "persistence"))]
pub fn enable() {
    let _ = user_config_exists;
}
