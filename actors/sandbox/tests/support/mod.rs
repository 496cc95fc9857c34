//! What the sandbox crate's integration tests and benches share: the image, default limits,
//! unique names for what they create, and the removal of a container however a test ends. Each test file and bench
//! compiles this module on its own and uses a part of it.
#![allow(dead_code)]

pub mod raw_exec;

use std::sync::atomic::{AtomicU32, Ordering};

use toolmesh_sandbox::backend::SandboxLimits;

/// The sandbox image: `TOOLMESH_SANDBOX_IMAGE`, by default `toolmesh/sandbox:latest`.
pub fn image() -> String {
    std::env::var("TOOLMESH_SANDBOX_IMAGE").unwrap_or_else(|_| "toolmesh/sandbox:latest".into())
}

/// The limits a test sandbox runs under unless it says otherwise: 512 MB, 64 processes, one
/// CPU, no network, 64 MB of tmpfs.
pub fn limits() -> SandboxLimits {
    SandboxLimits {
        memory_mb: 512,
        pids: 64,
        cpus: 1.0,
        network: "none".into(),
        tmpfs_mb: 64,
        runtime: None,
    }
}

/// `prefix`, this process's id and a counter: a name no other test or run takes.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes a container by name on drop (also when a test or bench panics).
pub struct ContainerGuard(pub String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", "-v", &self.0])
            .output();
    }
}
