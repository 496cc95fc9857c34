//! The tools a sandbox worker runs: `execute_skills` and the sandbox tools of PROTOCOL.md
//! (`sandbox_status`, `run_command`, `run_code`, `list_tasks`, `task_output`, `task_input`,
//! `kill_task`), one file each, listed in [`TOOLS`]. What they share is `crate::service`.

mod execute_skills;
mod kill_task;
mod list_tasks;
mod run_code;
mod run_command;
mod status;
mod task_input;
mod task_output;

use crate::service::SandboxEntry;

/// The sandbox worker's tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: &[SandboxEntry] = &[
    SandboxEntry::of::<execute_skills::ExecuteSkills>(),
    SandboxEntry::of::<status::Status>(),
    SandboxEntry::of::<run_command::RunCommand>(),
    SandboxEntry::of::<run_code::RunCode>(),
    SandboxEntry::of::<list_tasks::ListTasks>(),
    SandboxEntry::of::<task_output::TaskOutput>(),
    SandboxEntry::of::<task_input::TaskInput>(),
    SandboxEntry::of::<kill_task::KillTask>(),
];
