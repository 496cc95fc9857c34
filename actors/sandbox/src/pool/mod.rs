//! The pool of one worker: the sandboxes of the sessions it holds, a few started ones kept
//! warm for new sessions, and the cap on commands running at once.
//!
//! Each sandbox is made from a template ([`crate::templates`]); each template has a warm pool
//! of its own, filled only when the template declares `warm > 0` or once it has been used on
//! this worker ([`LAZY_WARM`] then, unless it declares `warm = 0`).
//!
//! Invariants:
//! * one sandbox per `(account, session)` on this worker; the registry says which worker;
//! * a session's sandbox is of one template for its whole life (a call naming another is
//!   refused `conflict` before it reaches the pool);
//! * a session's sandbox is created at most once at a time (a per-session `OnceCell`), so two
//!   first calls of one session racing each other share one sandbox;
//! * a sandbox leaves the pool only when no call and no background task uses it;
//! * nothing runs in a session's sandbox before its registry claim holds: a warm sandbox is
//!   handed to a new session at once with the claim still on its way ([`Session::claimed`]),
//!   so the first command's exec is created meanwhile, but it starts only once the claim holds;
//!   a lost claim puts the untouched sandbox back in the warm pool;
//! * a drain ([`Pool::shutdown`]) waits for every creation in flight, warm ones too, and removes
//!   what they made, then every sandbox and this worker's folder of the sandbox directory;
//! * a new session is admitted by [`crate::admission`] under the sessions lock, which also
//!   counts it from then until it is in its cell (`Reservation`): the per-account quota, and
//!   on a full worker the one session that makes room (the caller's own idle one first; never

//!
//! The parts: a [`Session`] and its use (`session`), the pool's state and bookkeeping
//! (`state`), opening, admitting, sweeping and removing sessions (`sessions`), making
//! sandboxes, the warm pools and the drain (`sandboxes`), and the sandbox folders and their
//! reapers (`folders`).
//!
//! [`LAZY_WARM`]: crate::templates::LAZY_WARM

mod error;
mod folders;
mod sandboxes;
mod session;
mod sessions;
mod state;

pub use error::PoolError;
pub use folders::DEAD_FOLDER_AGE;
pub use session::{OpenError, Session, SessionKey, SessionUse};
pub use state::{backend_error, Pool, PoolSettings};
