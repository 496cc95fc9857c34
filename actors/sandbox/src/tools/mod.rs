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
use execute_skills::ExecuteSkills;
use kill_task::KillTask;
use list_tasks::ListTasks;
use run_code::RunCode;
use run_command::RunCommand;
use status::Status;
use task_input::TaskInput;
use task_output::TaskOutput;

/// The sandbox worker's tools, in the order of PROTOCOL.md's tool table.
pub const TOOLS: &[SandboxEntry] = &[
    SandboxEntry::of::<ExecuteSkills>(),
    SandboxEntry::of::<Status>(),
    SandboxEntry::of::<RunCommand>(),
    SandboxEntry::of::<RunCode>(),
    SandboxEntry::of::<ListTasks>(),
    SandboxEntry::of::<TaskOutput>(),
    SandboxEntry::of::<TaskInput>(),
    SandboxEntry::of::<KillTask>(),
];
