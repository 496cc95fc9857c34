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
pub const TOOLS: &[&dyn SandboxEntry] = &[
    &execute_skills::ExecuteSkills,
    &status::Status,
    &run_command::RunCommand,
    &run_code::RunCode,
    &list_tasks::ListTasks,
    &task_output::TaskOutput,
    &task_input::TaskInput,
    &kill_task::KillTask,
];
