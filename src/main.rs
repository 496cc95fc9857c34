//! The `toolmesh` binary: parses the command line and hands over to the library.

fn main() -> std::process::ExitCode {
    toolmesh::cli::main()
}
