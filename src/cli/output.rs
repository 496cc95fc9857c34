//! What a client command prints: JSON lines and documents on stdout, hints on stderr, and the
//! exit code of a reply.

use std::process::ExitCode;

use serde_json::Value;

use toolmesh_kernel::text::display_json_pretty;

/// One line on stdout; fails (instead of panicking, as `println!` does) when the reader left.
pub(crate) fn emit(line: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// A line for the person on stderr; a closed stderr is not worth failing for.
pub(super) fn hint(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    emit(&display_json_pretty(value))
}

pub(super) fn exit_for(reply: &Value) -> ExitCode {
    if reply["ok"] == true {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
