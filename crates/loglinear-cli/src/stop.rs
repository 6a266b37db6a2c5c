//! A stop asked for by a signal — SIGTERM from a job scheduler, `timeout` or `kill`, SIGINT from
//! Ctrl-C: the training loops finish the step they are in, write a checkpoint of it and exit
//! with an error that says so, so that `--resume` (or the same sweep again) redoes no step. A
//! second Ctrl-C ends the process at once. `timeout`, terminals and schedulers signal a
//! sweep's whole process group, so its child runs and packs stop the same way; a sweep that
//! alone is signalled starts no new run and waits for the running ones.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a command that stopped by a signal after writing its checkpoint (75,
/// `EX_TEMPFAIL` of sysexits.h: "try again later"), so that a sweep, a scheduler or a script
/// tells a run to resume from one that failed.
pub const EXIT_STOPPED: i32 = 75;

/// The error a training loop returns when it stopped by a signal, its checkpoint written; the
/// message says where to resume from. `main` exits with [`EXIT_STOPPED`] on it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Stopped(pub String);

/// Whether `err` (or an error in its context chain) is a [`Stopped`].
pub fn is_stopped(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<Stopped>())
}

/// Catches SIGTERM and SIGINT from now on (Unix; elsewhere nothing changes). Only for commands
/// whose loops call [`requested`]: any other would no longer stop on SIGTERM at all.
pub fn install() {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic and resets a disposition, both
    // async-signal-safe.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

#[cfg(unix)]
extern "C" fn on_signal(signal: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
    if signal == libc::SIGINT {
        // SAFETY: async-signal-safe; a second Ctrl-C takes the default action.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
        }
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
