//! The sandboxes of a pool: making one (its folder, disk and network), the warm pools, their
//! removal, and the drain that removes them all.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use toolmesh_kernel::{ErrorCode, ToolError};

use crate::backend::{SandboxRef, SandboxSpec};
use crate::network::DecisionTap;
use crate::pool::error::PoolError;
use crate::pool::folders::{remove_folder, remove_folder_of};
use crate::pool::state::{backend_error, new_sandbox_id, shutting_down, Busy, Pool};
use crate::templates::{Template, LAZY_WARM};

impl Pool {
    /// Creates a sandbox, counted as busy until the caller drops the returned guard (once the
    /// sandbox is where shutdown finds it).
    pub(super) async fn create_sandbox(
        &self,
        sandbox_id: String,
        template: &Template,
    ) -> Result<(SandboxRef, Busy<'_>), ToolError> {
        let busy = self.begin().ok_or_else(shutting_down)?;
        self.node_dir_ready().await?;
        let folder = self.node_dir().join(&sandbox_id);
        self.attach_disk(&folder).await?;
        let egress = self.egress.lock().expect("egress lock").clone();
        let tap = DecisionTap::new(&sandbox_id, self.settings.metrics.clone());
        let network =
            match crate::network::network_of(template, egress.as_deref(), &sandbox_id, || {
                tap.on_decision()
            }) {
                Ok(network) => network,
                Err(e) => {
                    remove_folder(folder, "a sandbox folder").await;
                    return Err(ToolError::new(ErrorCode::Unavailable, e.to_string()));
                }
            };
        if network.registered {
            self.taps
                .lock()
                .expect("taps lock")
                .insert(sandbox_id.clone(), tap);
        }
        let spec = SandboxSpec {
            workspace_dir: folder.join("workspace"),
            sandbox_id,
            node_id: self.settings.node.as_str().to_owned(),
            scope: self.scope(),
            limits: crate::backend::SandboxLimits {
                network: network.mode,
                ..template.limits.clone()
            },
            image: Some(template.image.clone()),
            env: network.env,
        };
        let sandbox = match self.backend.create(&spec).await {
            Ok(sandbox) => sandbox,
            Err(e) => {
                self.forget_egress(&spec.sandbox_id);
                remove_folder(folder, "a sandbox folder").await;
                return Err(backend_error(e));
            }
        };
        if self.closed.load(Ordering::SeqCst) {
            // Finished after shutdown began, which removes only what it finds: this goes now.
            self.discard(&sandbox).await;
            return Err(shutting_down());
        }
        Ok((sandbox, busy))
    }

    /// Makes a sandbox's folder and, with a disk quota, mounts its own disk over it
    /// ([`crate::disk::attach`]), before the backend fills it.
    async fn attach_disk(&self, folder: &std::path::Path) -> Result<(), ToolError> {
        let (folder, group, mb) = (
            folder.to_owned(),
            self.backend.sandbox_group(),
            self.settings.disk.mb,
        );
        tokio::task::spawn_blocking(move || {
            crate::backend::make_private(&folder, group)?;
            if mb > 0 {
                if let Err(e) = crate::disk::attach(&folder, mb) {
                    let _ = std::fs::remove_dir(&folder);
                    return Err(e);
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|source| PoolError::Task {
            what: "preparing a sandbox's disk",
            source,
        })?
        .map_err(PoolError::Disk)?;
        Ok(())
    }

    pub(super) async fn discard(&self, sandbox: &SandboxRef) {
        let _ = self.backend.destroy(sandbox).await;
        self.forget_egress(&sandbox.sandbox_id);
        remove_folder_of(sandbox).await;
    }

    /// How many warm sandboxes of `template` this worker keeps: what it declares, else
    /// [`LAZY_WARM`] once a session here has used it (none before).
    pub fn warm_target(&self, template: &Template) -> usize {
        template.warm.unwrap_or_else(|| {
            if self
                .used
                .lock()
                .expect("used lock")
                .contains(&template.name)
            {
                LAZY_WARM
            } else {
                0
            }
        })
    }

    /// Warm sandboxes of `template` ready now.
    pub fn warm_ready(&self, template: &str) -> usize {
        self.warm
            .lock()
            .expect("warm lock")
            .get(template)
            .map_or(0, VecDeque::len)
    }

    /// Tops every template's warm pool up to its size (sandboxes being created count), one
    /// template after the other.
    pub async fn fill_warm(self: &Arc<Self>) {
        let templates: Vec<Arc<Template>> = self.settings.templates.iter().cloned().collect();
        for template in templates {
            self.fill_warm_of(&template).await;
        }
    }

    async fn fill_warm_of(self: &Arc<Self>, template: &Template) {
        let name = &template.name;
        loop {
            {
                let warming = self.warming.lock().expect("warming lock");
                let have = self.warm_ready(name) + warming.get(name.as_str()).copied().unwrap_or(0);
                if have >= self.warm_target(template) {
                    return;
                }
            }
            *self
                .warming
                .lock()
                .expect("warming lock")
                .entry(name.clone())
                .or_default() += 1;
            // Busy until it is in the warm pool, so that shutdown waits for it and then finds
            // it there (one finished after shutdown began is removed by `create_sandbox`).
            let created = match self.create_sandbox(new_sandbox_id(), template).await {
                Ok((sandbox, busy)) => {
                    self.warm
                        .lock()
                        .expect("warm lock")
                        .entry(name.clone())
                        .or_default()
                        .push_back(sandbox);
                    drop(busy);
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Some(n) = self.warming.lock().expect("warming lock").get_mut(name) {
                *n -= 1;
            }
            if let Err(e) = created {
                tracing::warn!(error = %e, template = %name, "cannot create a warm sandbox");
                return;
            }
        }
    }

    /// Removes every sandbox of this worker and its folder of the sandbox directory (drain).
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Creations in flight (warm ones, started at the worker's start) land first, in the
        // warm pool or removed by `create_sandbox`, and evicted sessions finish going; the
        // process may exit right after this returns. (The node's drain bounds the wait.)
        self.wait_idle().await;
        let all = self.settled_sessions();
        for (key, session) in all {
            self.remove(&key, &session).await;
        }
        let warm: Vec<SandboxRef> = self
            .warm
            .lock()
            .expect("warm lock")
            .drain()
            .flat_map(|(_, warm)| warm)
            .collect();
        for sandbox in warm {
            self.discard(&sandbox).await;
        }
        let dir = self.node_dir();
        // What is left (a removal that failed) goes at the next start: see `reap_orphans`.
        remove_folder(dir, "this worker's sandbox folder").await;
        // The sandboxes are gone, so the egress network can go too. (A creation still holding
        // the proxy leaves the network to the next start's reaper.)
        let egress = self.egress.lock().expect("egress lock").take();
        if let Some(egress) = egress.and_then(Arc::into_inner) {
            egress.shutdown().await;
        }
    }
}
