//! The process backend's spawner as a program of its own, for this crate's tests and
//! benchmarks (the node runs `toolmesh sandbox-spawner`, the same code).

fn main() -> std::process::ExitCode {
    toolmesh_sandbox::backend::spawner::serve()
}
