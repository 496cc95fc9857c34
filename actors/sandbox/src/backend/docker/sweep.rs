//! Exec mode's sweep: the shell function that ends what a command left running, the wrapper
//! every command runs under, its end line, and the kill exec.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::RestartContainerOptions;
use bollard::Docker;
use bytes::Bytes;
use futures::StreamExt;

use crate::backend::docker::common::{status, SANDBOX_USER};
use crate::backend::{KillSwitch, Output};

/// Rounds of "find and SIGKILL" before a sweep gives up (forks racing the kill).
pub(super) const KILL_ROUNDS: u32 = 50;
/// Runs of the kill exec before the container is restarted instead.
const KILL_ATTEMPTS: u32 = 3;
/// How long one kill exec may take before the container is restarted instead (a leftover
/// may have stopped it: it is the sandbox user too).
const KILL_WAIT: Duration = Duration::from_secs(10);
/// What the wrapper writes last on its stderr once its sweep left nothing, before its nonce.
const END_LINE: &[u8] = b"\0toolmesh-swept:";

/// `toolmesh_sweep ID ROUNDS MARKED`: SIGKILLs every process whose environment holds
/// `TOOLMESH_EXEC_ID=ID`, and every orphan (a process whose parent is the container's init,
/// other than the container's own command, the oldest such) whose `TOOLMESH_EXEC_ID` is not
/// that of a command still running (a process whose parent pid reads 0, other than init,
/// `ID` excluded), until none is found (at most `ROUNDS` rounds; returns 1 if some remain).
/// The shell itself (`$$`) is spared. With `MARKED` 0 (the command `ID` has ended, so all that
/// is left of it is below orphans) the environments are read only when orphans exist. An
/// orphan's children become orphans when it dies, so the rounds take a whole escaped tree.
/// Each round stops the whole set before killing it, so no parent sees a child die and exits
/// on its own first, and no fork slips through. POSIX sh, GNU grep (`-z`: NUL-separated
/// records) and shell builtins only; a `stat` line is read after its last `) `, as the name
/// before it may hold anything. Whoever runs it must not carry `TOOLMESH_EXEC_ID` into the
/// programs it starts.
const SWEEP: &str = r#"toolmesh_sweep() {
  id=$1; rounds=$2; marked=$3; n=0; main=; oldest=
  while [ "$n" -lt "$rounds" ]; do
    heads=; orphans=; cand=; pids=
    for s in /proc/[0-9]*/stat; do
      { read -r line < "$s"; } 2>/dev/null || continue
      p=${s#/proc/}; p=${p%/stat}
      set -- ${line##*") "}
      case $2 in
        0) [ "$p" = 1 ] || [ "$p" = "$$" ] || heads="$heads $p" ;;
        1) [ "$1" = Z ] || orphans="$orphans $p"
           if [ "$n" = 0 ] && { [ -z "$oldest" ] || [ "${20}" -lt "$oldest" ] || { [ "${20}" = "$oldest" ] && [ "$p" -lt "$main" ]; }; }; then
             oldest=${20}; main=$p
           fi ;;
      esac
    done
    for p in $orphans; do [ "$p" = "$main" ] || cand="$cand $p"; done
    if [ -n "$cand" ]; then
      live=" "
      for p in $heads; do
        mark=$(grep -azm1 '^TOOLMESH_EXEC_ID=' "/proc/$p/environ" 2>/dev/null | tr -d '\0')
        mark=${mark#TOOLMESH_EXEC_ID=}
        [ -z "$mark" ] || [ "$mark" = "$id" ] || live="$live$mark "
      done
      for p in $cand; do
        mark=$(grep -azm1 '^TOOLMESH_EXEC_ID=' "/proc/$p/environ" 2>/dev/null | tr -d '\0')
        mark=${mark#TOOLMESH_EXEC_ID=}
        if [ -n "$mark" ]; then case "$live" in *" $mark "*) continue ;; esac; fi
        pids="$pids $p"
      done
    fi
    if [ -n "$cand" ] || [ "$marked" = 1 ]; then
      for f in $(grep -lzxF -e "TOOLMESH_EXEC_ID=$id" /proc/[0-9]*/environ 2>/dev/null); do
        p=${f#/proc/}; p=${p%/environ}
        [ "$p" = "$$" ] || pids="$pids $p"
      done
    fi
    [ -n "$pids" ] || return 0
    kill -STOP $pids 2>/dev/null
    kill -KILL $pids 2>/dev/null
    n=$((n+1))
  done
  return 1
}"#;

/// The kill exec: `sh -c KILLER toolmesh-kill ID ROUNDS`, exit 0 when nothing of `ID` is left.
static KILLER: LazyLock<String> =
    LazyLock::new(|| format!("{SWEEP}\ntoolmesh_sweep \"$1\" \"$2\" 1"));

/// Every command's exec: `sh -c WRAPPER toolmesh-exec ID ROUNDS ARGV…`. Reads the nonce line,
/// runs `ARGV` (`exec` in a subshell: a program, never a shell builtin), drops the marker from
/// what it starts next, sweeps, writes the end line if the sweep left nothing, and exits with
/// the command's code (128 + the signal that killed it).
pub(super) static WRAPPER: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"{SWEEP}
toolmesh_id=$1; toolmesh_rounds=$2; shift 2
IFS= read -r toolmesh_nonce || toolmesh_nonce=
( exec "$@" )
toolmesh_code=$?
unset TOOLMESH_EXEC_ID
if toolmesh_sweep "$toolmesh_id" "$toolmesh_rounds" 0 && [ -n "$toolmesh_nonce" ]; then
  printf '\0toolmesh-swept:%s\n' "$toolmesh_nonce" >&2
fi
exit "$toolmesh_code""#
    )
});

/// Takes the wrapper's end line (`END_LINE`, its nonce, a newline) off an exec's stderr. Output
/// passes on as it comes, but for a tail of stderr that may be the start of the end line: held
/// until more output shows it is not (then passed on, before that output), or until the
/// stream ends (then it is the end line if it is all of it, else output). A whole end line is
/// held across stdout that follows it: Docker copies an exec's stdout and stderr by separate
/// pipes, so stdout written before the end line may arrive after it. Only more stderr shows
/// that it was output.
pub(super) struct EndLine {
    expected: Vec<u8>,
    /// Stderr not passed on yet: a beginning of `expected`.
    held: Vec<u8>,
}

impl EndLine {
    pub(super) fn new(nonce: &str) -> Self {
        let mut expected = END_LINE.to_vec();
        expected.extend_from_slice(nonce.as_bytes());
        expected.push(b'\n');
        Self {
            expected,
            held: Vec::new(),
        }
    }

    /// What to pass on for a chunk of stdout.
    pub(super) fn stdout(&mut self, message: Bytes) -> [Option<Output>; 2] {
        let held = if self.held == self.expected {
            None
        } else {
            self.release()
        };
        [held, Some(Output::Stdout(message))]
    }

    /// What to pass on for a chunk of stderr.
    pub(super) fn stderr(&mut self, message: Bytes) -> [Option<Output>; 2] {
        let data = match self.release() {
            None => message,
            Some(Output::Stderr(held) | Output::Stdout(held)) => {
                let mut data = Vec::with_capacity(held.len() + message.len());
                data.extend_from_slice(&held);
                data.extend_from_slice(&message);
                Bytes::from(data)
            }
        };
        let keep = (1..=data.len().min(self.expected.len()))
            .rev()
            .find(|k| data.ends_with(&self.expected[..*k]))
            .unwrap_or(0);
        let pass = data.len() - keep;
        self.held = data[pass..].to_vec();
        [(pass > 0).then(|| Output::Stderr(data.slice(..pass))), None]
    }

    /// At the end of the stream: what is left to pass on, and whether the end line came.
    pub(super) fn finish(mut self) -> (Option<Output>, bool) {
        if self.held == self.expected {
            return (None, true);
        }
        (self.release(), false)
    }

    fn release(&mut self) -> Option<Output> {
        (!self.held.is_empty()).then(|| Output::Stderr(std::mem::take(&mut self.held).into()))
    }
}

/// Whether an exec's processes were swept since its end or by a kill (then there is nothing
/// left to kill); held while a kill exec runs, so its end waits for a kill in flight.
pub(super) type Swept = Arc<tokio::sync::Mutex<bool>>;

pub(super) fn kill_switch(
    docker: Docker,
    container: String,
    exec_id: String,
    swept: Swept,
) -> KillSwitch {
    KillSwitch(Arc::new(move || {
        let (docker, container, exec_id) = (docker.clone(), container.clone(), exec_id.clone());
        let swept = Arc::clone(&swept);
        Box::pin(async move {
            let mut done = swept.lock().await;
            if !*done {
                kill_tree(&docker, &container, &exec_id).await;
                *done = true;
            }
        })
    }))
}

/// Runs the kill exec ([`SWEEP`] of `exec_id`) in the container as the sandbox user, a few
/// times if it cannot start or finish (a fork bomb can hold every pid the container may
/// have). As a last resort, or when one run does not end within [`KILL_WAIT`], the container
/// is restarted (`docker restart -t 0`: every process in it dies; the container id, its
/// workspace and limits stay).
pub(super) async fn kill_tree(docker: &Docker, container: &str, exec_id: &str) {
    for attempt in 1..=KILL_ATTEMPTS {
        match tokio::time::timeout(KILL_WAIT, run_killer(docker, container, exec_id)).await {
            Ok(Ok(0)) => return,
            Ok(Ok(code)) => {
                tracing::debug!(attempt, code, exec_id, "kill exec did not finish the job")
            }
            Ok(Err(e)) if matches!(status(&e), Some(404 | 409)) => return, // the container is gone
            Ok(Err(e)) => tracing::debug!(attempt, error = %e, exec_id, "kill exec failed"),
            Err(_) => {
                tracing::debug!(attempt, exec_id, "kill exec did not end in time");
                break;
            }
        }
    }
    tracing::warn!(
        container,
        exec_id,
        "cannot kill the process tree from inside; restarting the sandbox"
    );
    let options = RestartContainerOptions {
        signal: Some("SIGKILL".to_owned()),
        t: Some(0),
    };
    if let Err(e) = docker.restart_container(container, Some(options)).await {
        tracing::warn!(container, error = %e, "restarting the sandbox failed");
    }
}

/// One kill exec; its exit code (0: nothing of the tree is left).
async fn run_killer(docker: &Docker, container: &str, exec_id: &str) -> Result<i64, DockerError> {
    let cmd = [
        "sh",
        "-c",
        KILLER.as_str(),
        "toolmesh-kill",
        exec_id,
        &KILL_ROUNDS.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd),
                user: Some(SANDBOX_USER.to_owned()),
                ..Default::default()
            },
        )
        .await?;
    let options = StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: None,
    };
    if let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&created.id, Some(options)).await?
    {
        while output.next().await.is_some() {}
    }
    let mut delay = Duration::from_millis(1);
    for _ in 0..20 {
        let inspect = docker.inspect_exec(&created.id).await?;
        if let (Some(false), Some(code)) = (inspect.running, inspect.exit_code) {
            return Ok(code);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
    Ok(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` (`o:` stdout, `e:` stderr) through an [`EndLine`] for nonce `n1`: what
    /// passes on, in order (`o:`/`e:` again), and whether the end line came.
    fn check(chunks: &[&str], expect: &[&str], clean: bool) {
        let mut end_line = EndLine::new("n1");
        let mut passed = Vec::new();
        let mut pass = |out: Option<Output>| match out {
            Some(Output::Stdout(b)) => passed.push(format!("o:{}", String::from_utf8_lossy(&b))),
            Some(Output::Stderr(b)) => passed.push(format!("e:{}", String::from_utf8_lossy(&b))),
            None => {}
        };
        for chunk in chunks {
            let bytes = Bytes::from(chunk[2..].to_owned());
            let outs = match &chunk[..2] {
                "o:" => end_line.stdout(bytes),
                _ => end_line.stderr(bytes),
            };
            outs.into_iter().for_each(&mut pass);
        }
        let (rest, came) = end_line.finish();
        pass(rest);
        let expect: Vec<String> = expect.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!((passed, came), (expect, clean), "{chunks:?}");
    }

    #[test]
    fn the_end_line_is_taken_off_stderr_only_at_the_very_end() {
        let end = "\0toolmesh-swept:n1\n";
        check(&[], &[], false);
        check(&["o:out", "e:err"], &["o:out", "e:err"], false);
        check(&[&format!("e:err{end}")], &["e:err"], true);
        check(&["o:out", &format!("e:{end}")], &["o:out"], true);
        // In pieces, the first held back until the rest shows what it is.
        check(&["e:a\0tool", "e:mesh-swept:", "e:n1\n"], &["e:a"], true);
        // Stdout after it was written before it (Docker's two pipes reorder); stderr after
        // it shows it was output.
        check(&[&format!("e:{end}"), "o:late"], &["o:late"], true);
        check(
            &[&format!("e:{end}"), "o:late", "e:more"],
            &["o:late", &format!("e:{end}more")],
            false,
        );
        check(&[&format!("e:{end}x")], &[&format!("e:{end}x")], false);
        // A held tail is passed on before the stdout that follows it.
        check(&["e:x\0too", "o:y"], &["e:x", "e:\0too", "o:y"], false);
        // Another nonce, or a line cut short, is output.
        check(
            &["e:\0toolmesh-swept:n2\n"],
            &["e:\0toolmesh-swept:n2\n"],
            false,
        );
        check(
            &["e:\0toolmesh-swept:n1"],
            &["e:\0toolmesh-swept:n1"],
            false,
        );
    }
}
