//! Integration tests of the workspace actor crate, one module per area.

mod escapes;
mod files;
mod sync;
