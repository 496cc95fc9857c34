//! Read state shared by every workspace node, in Redis: which files a session has read (or
//! written), with the sha256 of the content it saw, so that an edit served by any node can
//! refuse `file_not_read` and `conflict`. Plus a per-file lock that makes "check, then write"
//! one step among toolmesh writers, so two racing edits cannot both succeed silently.
//!
//! Keys (one Redis; no cluster slots needed):
//! * `toolmesh:readstate:<account>:<session>`: hash, relative path → sha256 hex, expiring
//!   [`READ_STATE_TTL`] after the session last touched it.
//! * `toolmesh:filelock:<account>:<session>:<path>`: the lock token, expiring on its own if a
//!   node dies holding it.

use std::time::Duration;

use redis::{AsyncCommands, Script};
use toolmesh_kernel::error::DisplayChain;
use toolmesh_kernel::redis_link::{RedisConfig, RedisConn, RedisLink};
use toolmesh_kernel::text::DisplaySafe;
use toolmesh_kernel::{Account, ErrorCode, SessionId, ToolError};

/// How long a session's read state lives after its last read or write.
pub const READ_STATE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// A lock outlives no node: it expires after this even if its holder died.
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// How long a writer waits for a file another call is writing.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The read-state store; connects on first use and reconnects by itself (through Sentinel,
/// to the primary of the moment: [`RedisLink`]). Its writes wait for no replica: a record a
/// failover loses makes the next edit answer `file_not_read`, and a lost lock expires.
pub struct ReadState {
    link: RedisLink,
    unlock: Script,
}

impl std::fmt::Debug for ReadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadState").finish_non_exhaustive()
    }
}

/// Why the read state or a file lock could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ReadStateError {
    #[error("the read-state store (Redis) is not reachable; retry in a moment")]
    Unreachable(#[source] redis::RedisError),
    /// Another call held the file's lock for all of [`LOCK_WAIT`].
    #[error("{path} is being written by another call; retry")]
    Busy { path: String },
}

/// What kind of [`ReadStateError`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStateErrorKind {
    /// Redis is not reachable: `unavailable`.
    Unavailable,
    /// The file is being written: `conflict`.
    Busy,
}

impl ReadStateError {
    pub fn kind(&self) -> ReadStateErrorKind {
        match self {
            ReadStateError::Unreachable(_) => ReadStateErrorKind::Unavailable,
            ReadStateError::Busy { .. } => ReadStateErrorKind::Busy,
        }
    }
}

/// PROTOCOL.md's code and sentence; an `unavailable` one logs its cause here.
impl From<ReadStateError> for ToolError {
    fn from(e: ReadStateError) -> Self {
        match e.kind() {
            ReadStateErrorKind::Unavailable => {
                tracing::warn!(error = %DisplayChain(&e), "read state store unreachable");
                ToolError::new(ErrorCode::Unavailable, e.to_string())
            }
            ReadStateErrorKind::Busy => ToolError::new(ErrorCode::Conflict, e.to_string()),
        }
    }
}

fn unavailable(e: redis::RedisError) -> ReadStateError {
    ReadStateError::Unreachable(e)
}

fn state_key(account: &Account, session: &SessionId) -> String {
    format!("toolmesh:readstate:{account}:{session}")
}

fn lock_key(account: &Account, session: &SessionId, path: &str) -> String {
    format!("toolmesh:filelock:{account}:{session}:{path}")
}

/// A held file lock; release it with [`ReadState::unlock`] (it also expires by itself).
#[derive(Debug)]
pub struct FileLock {
    key: String,
    token: String,
}

impl ReadState {
    /// Only a malformed URL fails here; nothing connects before the first use.
    pub fn new(redis: &RedisConfig) -> Result<Self, redis::RedisError> {
        Ok(Self {
            link: RedisLink::new(redis)?,
            unlock: Script::new(UNLOCK),
        })
    }

    async fn conn(&self) -> Result<RedisConn, ReadStateError> {
        self.link.connection().await.map_err(unavailable)
    }

    /// Remembers that the session saw `path` with this content hash.
    pub async fn record(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        sha256: &str,
    ) -> Result<(), ReadStateError> {
        let key = state_key(account, session);
        let mut conn = self.conn().await?;
        redis::pipe()
            .hset(&key, path, sha256)
            .ignore()
            .expire(&key, READ_STATE_TTL.as_secs() as i64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(unavailable)
    }

    /// Sends the record of [`ReadState::record`] without waiting for Redis to answer, for the
    /// read path (a read is answered as soon as the file is read). The command is handed to the
    /// connection before this returns, so every later command of this node (an edit's lock and
    /// `HGET`) is queued behind it on the same multiplexed connection and sees it; the answer is
    /// awaited in the background, and a failure there is logged (the next read records again).
    ///
    /// True when the command was sent; false when Redis is not reachable at all (logged too).
    ///
    /// The one race this opens: the caller gets the reply before Redis has applied the record,
    /// so an edit served by *another* node that overtakes the record (its `HGET` reaching Redis
    /// first) answers `file_not_read`, the safe side: nothing is written, and reading again
    /// fixes it. An edit can never pass on a record that does not hold.
    pub async fn record_pipelined(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
        sha256: &str,
    ) -> bool {
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %DisplayChain(&e), "read state store unreachable");
                return false;
            }
        };
        let key = state_key(account, session);
        let mut pipe = redis::pipe();
        pipe.hset(&key, path, sha256)
            .ignore()
            .expire(&key, READ_STATE_TTL.as_secs() as i64)
            .ignore();
        let path = path.to_owned();
        let mut pending = Box::pin(async move { pipe.query_async::<()>(&mut conn).await });
        // One poll hands the command to the connection's queue (its writer task sends it).
        match futures::poll!(pending.as_mut()) {
            std::task::Poll::Ready(Ok(())) => true,
            std::task::Poll::Ready(Err(e)) => {
                tracing::warn!(error = %e, path = %DisplaySafe(&path), "could not record a read; a later edit of it answers file_not_read until it is read again");
                false
            }
            std::task::Poll::Pending => {
                tokio::spawn(async move {
                    if let Err(e) = pending.await {
                        tracing::warn!(error = %e, path = %DisplaySafe(&path), "could not record a read; a later edit of it answers file_not_read until it is read again");
                    }
                });
                true
            }
        }
    }

    /// The hash the session last saw for `path`, if it read or wrote it.
    pub async fn recorded(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
    ) -> Result<Option<String>, ReadStateError> {
        let mut conn = self.conn().await?;
        conn.hget(state_key(account, session), path)
            .await
            .map_err(unavailable)
    }

    /// Forgets `path` (after a delete).
    pub async fn forget(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
    ) -> Result<(), ReadStateError> {
        let mut conn = self.conn().await?;
        conn.hdel::<_, _, ()>(state_key(account, session), path)
            .await
            .map_err(unavailable)
    }

    /// Takes the lock of one file of the session, waiting up to [`LOCK_WAIT`] for another
    /// writer; `conflict` when it stays busy.
    pub async fn lock(
        &self,
        account: &Account,
        session: &SessionId,
        path: &str,
    ) -> Result<FileLock, ReadStateError> {
        let key = lock_key(account, session, path);
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut conn = self.conn().await?;
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let mut pause = Duration::from_millis(2);
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            if taken.is_some() {
                return Ok(FileLock { key, token });
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(ReadStateError::Busy {
                    path: path.to_owned(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Releases a lock if it is still ours (it may have expired and been taken by another).
    pub async fn unlock(&self, lock: FileLock) {
        let mut conn = match self.conn().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %DisplayChain(&e), "read state store unreachable");
                return;
            }
        };
        let released: Result<i64, _> = self
            .unlock
            .key(&lock.key)
            .arg(&lock.token)
            .invoke_async(&mut conn)
            .await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "could not release a file lock; it expires by itself");
        }
    }
}
