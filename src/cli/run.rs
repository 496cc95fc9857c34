//! `toolmesh`'s `main`: parses the command line, sets up the log, and runs a node, the Skill
//! Service, the sandbox spawner or a client command; errors become the exit code.

use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Parser;

use toolmesh_kernel::config::{NodeConfig, RawEnv};

use crate::cli::args::{Cli, Command, NATS_URL_ARG, NATS_URL_VAR};
use crate::cli::commands::run_client;
use crate::cli::output::hint;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::SandboxSpawner { listen } = &cli.command {
        // Before anything else: no runtime, no logging; it speaks only on its socket.
        return toolmesh_sandbox::backend::spawner::serve(listen.as_deref());
    }
    // A node logs what it does (its tracing starts once its id is known, for its traces); a
    // client command keeps stdout/stderr for the person.
    match cli.command {
        Command::Node { .. } => {}
        Command::SkillService { .. } => init_tracing("info", None),
        // The client's own error line says what went wrong; async-nats's log of the same
        // failure would only say it twice.
        _ => init_tracing("warn,async_nats=off", None),
    }
    let result = match cli.command {
        Command::Node { roles } => run_node(&cli.nats_url, &roles),
        Command::SkillService {
            dir,
            listen,
            space,
            token,
            public_url,
        } => client_runtime().and_then(|rt| {
            rt.block_on(toolmesh_skills::service::run_from_dir(
                &dir,
                listen,
                &space,
                toolmesh_skills::service::ServiceOptions { token, public_url },
                toolmesh_kernel::host::shutdown_signal(),
            ))
            .map_err(anyhow::Error::msg)?;
            Ok(ExitCode::SUCCESS)
        }),
        command => client_runtime().and_then(|rt| {
            rt.block_on(run_client(
                &cli.nats_url,
                cli.inbox_prefix.as_deref(),
                command,
            ))
        }),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`toolmesh status | head`): nothing more to say, and nobody to
        // say it to, so stop quietly, as ripgrep does.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            hint(&format!("toolmesh: {}", error_text(&e)));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, `: `-separated, each cause once: many errors (async-nats's among
/// them) already print their source, which `{:#}` would print again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The node's runtime (`TOOLMESH_WORKER_THREADS`): 0, one thread; n, a multi-thread runtime of
/// n workers. Not a number stops the node naming the variable.
fn worker_threads() -> anyhow::Result<usize> {
    match std::env::var("TOOLMESH_WORKER_THREADS") {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "TOOLMESH_WORKER_THREADS={v:?}: use 0 (one thread) or a number of workers"
            )
        }),
    }
}

/// Whether the log is JSON lines (`TOOLMESH_LOG_FORMAT`: `json`, or `text`, the default); another
/// value stops a node naming the variable.
fn log_format() -> anyhow::Result<bool> {
    match std::env::var("TOOLMESH_LOG_FORMAT").as_deref() {
        Err(_) | Ok("" | "text") => Ok(false),
        Ok("json") => Ok(true),
        Ok(other) => bail!("TOOLMESH_LOG_FORMAT={other:?}: use json or text"),
    }
}

/// The log on stderr (`RUST_LOG`, else `default_level`; `TOOLMESH_LOG_FORMAT=json`), and the
/// spans of toolmesh's crates to `exporter` when there is one (`crate::otel`).
fn init_tracing(default_level: &str, exporter: Option<&crate::otel::Exporter>) {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = log_format().unwrap_or(false);
    // Colours for a person at a terminal only: a pipe, a file or `docker logs` gets plain
    // text, and so does anyone who sets NO_COLOR (no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(colour)
            .with_writer(std::io::stderr)
            .with_filter(filter.clone())
    });
    let json = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
    });
    // Its own filter: a quieter log does not thin the traces, and no other crate's spans
    // (the exporter's HTTP client's among them) reach them.
    let otel = exporter.map(|exporter| {
        tracing_opentelemetry::layer()
            .with_tracer(exporter.tracer())
            .with_filter(Targets::new().with_target("toolmesh", LevelFilter::INFO))
    });
    tracing_subscriber::registry()
        .with(text)
        .with(json)
        .with(otel)
        .init();
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn run_node(nats_url: &str, roles: &str) -> anyhow::Result<ExitCode> {
    // The flag wins over the variable (clap read either into `nats_url`).
    toolmesh_kernel::config::nats_url(Some(nats_url), NATS_URL_ARG)?;
    let mut config = NodeConfig::from_env(&RawEnv::from_process().with(NATS_URL_VAR, nats_url))?;
    // Resolved here, once: the traces name the node as its heartbeats do.
    let node_id = crate::node::node_id(&config)?;
    config.node_id = Some(node_id.to_string());
    // Dropped last, after the node stopped: its last spans leave then.
    let exporter = crate::otel::from_env(node_id.as_str())?;
    let threads = worker_threads()?;
    log_format()?;
    init_tracing("info", exporter.as_ref());
    let resolved = crate::node::resolve_roles(roles).map_err(anyhow::Error::msg)?;
    if resolved.is_empty() {
        bail!("no role to run");
    }
    let skipped: Vec<&str> = toolmesh_kernel::Role::ALL
        .iter()
        .filter(|r| !resolved.contains(r))
        .map(|r| r.as_str())
        .collect();
    if roles.split(',').any(|r| r.trim() == "all") && !skipped.is_empty() {
        tracing::info!(
            "roles not in this build are not started: {}",
            skipped.join(", ")
        );
    }
    let system = if threads == 0 {
        actix_rt::System::new()
    } else {
        actix_rt::System::with_tokio_rt(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
                .expect("tokio runtime builds")
        })
    };
    system.block_on(crate::node::run(
        config,
        resolved,
        toolmesh_kernel::host::shutdown_signal(),
    ))?;
    drop(exporter);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use crate::cli::run::error_text;

    #[test]
    fn an_error_names_each_cause_once() {
        /// An error that prints its source itself, as many do.
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "connection failed: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let inner = std::io::Error::other("timed out");
        let e = anyhow::Error::new(Outer(inner)).context("cannot connect to NATS");
        assert_eq!(
            error_text(&e),
            "cannot connect to NATS: connection failed: timed out"
        );
        let plain = anyhow::anyhow!("a").context("b");
        assert_eq!(error_text(&plain), "b: a");
    }
}
