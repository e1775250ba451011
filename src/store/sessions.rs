//! Admin sessions, kept in Redis so that signing out or their hours passing ends them:
//! a hash per session under the SHA-256 of its random id, with the session's TTL.

use super::Store;

/// What a session remembers: the admin token's name (for the log of admin actions) and a
/// mark of that token (an HMAC keyed by it), so a token rotated out ends its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSession {
    pub name: String,
    pub owner: String,
}

/// Opens a session for `ttl_secs`.
pub async fn open(store: &Store, id_hash: &str, session: &AdminSession, ttl_secs: u64) -> anyhow::Result<()> {
    let key = store.keys.admin_session(id_hash);
    let mut conn = store.conn().await?;
    redis::pipe()
        .atomic()
        .hset_multiple(&key, &[("name", session.name.as_str()), ("owner", session.owner.as_str())])
        .ignore()
        .expire(&key, ttl_secs as i64)
        .ignore()
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// The session under `id_hash`, if it has not ended.
pub async fn find(store: &Store, id_hash: &str) -> anyhow::Result<Option<AdminSession>> {
    let mut conn = store.conn().await?;
    let (name, owner): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(store.keys.admin_session(id_hash))
        .arg("name")
        .arg("owner")
        .query_async(&mut conn)
        .await?;
    Ok(name.zip(owner).map(|(name, owner)| AdminSession { name, owner }))
}

/// Ends the session under `id_hash` (nothing if there is none).
pub async fn end(store: &Store, id_hash: &str) -> anyhow::Result<()> {
    let mut conn = store.conn().await?;
    redis::cmd("DEL").arg(store.keys.admin_session(id_hash)).query_async::<()>(&mut conn).await?;
    Ok(())
}
