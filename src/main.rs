//! The `toolmesh` binary: parses the command line and hands over to the library.

// Replies and events are many small JSON allocations; mimalloc serves them faster than glibc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    toolmesh::cli::main()
}
