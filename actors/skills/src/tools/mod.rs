//! The skill tools (`list_skills`, `search_skills`, `load_skill`), one file each (definition,
//! arguments, handler) listed in [`TOOLS`]; what they share, with the bundle subject's server
//! side, is `crate::library`. `execute_skills` runs in the sandbox worker.

mod list_skills;
mod load_skill;
mod search_skills;

use toolmesh_kernel::tools::{Entry, Table};

use crate::library::SkillsService;

/// The skill loader's tools.
pub const TOOLS: Table<SkillsService> = &[
    Entry::of::<list_skills::ListSkills>(),
    Entry::of::<search_skills::SearchSkills>(),
    Entry::of::<load_skill::LoadSkill>(),
];
