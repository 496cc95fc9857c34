//! A raw `docker exec` through bollard, the baseline the exec benches measure the sandbox
//! backend and the tools against: the sandbox crate's (`benches/exec.rs`, through
//! `support::raw_exec`) and the root's (`benches/support`, which includes this file).

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;

/// Raw exec of `argv` in `container`, attached to its end; asserts exit 0. As the sandbox user,
/// it runs as uid 1000 in `/workspace` with an exec id, as the exec backend's commands do.
pub async fn raw_exec(docker: &Docker, container: &str, argv: &[&str], as_sandbox_user: bool) {
    let mut options = CreateExecOptions {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(argv.iter().map(|s| (*s).to_owned()).collect()),
        ..Default::default()
    };
    if as_sandbox_user {
        options.user = Some("1000:1000".to_owned());
        options.working_dir = Some("/workspace".to_owned());
        options.env = Some(vec!["TOOLMESH_EXEC_ID=exec-bench".to_owned()]);
        options.tty = Some(false);
        options.attach_stdin = Some(false);
    }
    let created = docker
        .create_exec(container, options)
        .await
        .expect("create_exec");
    let start = StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: None,
    };
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&created.id, Some(start))
        .await
        .expect("start_exec")
    {
        while output.next().await.is_some() {}
    }
    let inspect = docker
        .inspect_exec(&created.id)
        .await
        .expect("inspect_exec");
    assert_eq!(inspect.exit_code, Some(0), "raw exec exit");
}
