//! The sandbox spawner as a program of its own, for this crate's tests and benchmarks (the
//! node runs `toolmesh sandbox-spawner`, the same code).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match toolmesh_sandbox::backend::spawner::listen_arg(&args) {
        Ok(listen) => toolmesh_sandbox::backend::spawner::serve(listen.as_deref()),
        Err(e) => {
            eprintln!("toolmesh-sandbox-spawner: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
