//! A campaign period's fan-out record (fanout.lua): acquire, progress, rewind, finish.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, flag, unexpected};
use crate::store::keys::Keys;

/// What acquiring a fan-out record found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fanout {
    /// Ours now; `resumed` when it continues a fan-out that stopped halfway; one SSCAN
    /// cursor per partition (`None`: that partition is finished).
    Acquired { resumed: bool, cursors: Vec<Option<u64>> },
    /// Another holder is fanning it out.
    Held { owner: String },
    /// Already fanned out.
    Done,
}

/// One campaign period's fan-out, as run by `owner`.
#[derive(Debug, Clone, Copy)]
pub struct FanoutOf<'a> {
    pub campaign: &'a str,
    pub period: &'a str,
    pub owner: &'a str,
}

/// Takes the fan-out record of a campaign period for its owner (`restart`: start again
/// if it is done, as an operator's kick does; a scheduler never does).
pub(crate) async fn fanout_acquire(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    run: FanoutOf<'_>,
    lease_ms: u64,
    restart: bool,
    retention_secs: u64,
) -> RedisResult<Fanout> {
    let row: Vec<String> = SCRIPTS
        .fanout
        .key(keys.fanout(run.campaign, run.period))
        .arg("acquire")
        .arg(run.owner)
        .arg(lease_ms)
        .arg(if restart { "1" } else { "0" })
        .arg(keys.partitions())
        .arg(retention_secs)
        .invoke_async(conn)
        .await?;
    read_acquire(row)
}

/// fanout.lua acquire's answer: acquired (resumed or not, a cursor or `done` per
/// partition), held (by whom), or done.
pub(super) fn read_acquire(row: Vec<String>) -> RedisResult<Fanout> {
    let bad = |row: &[String]| unexpected("fanout.lua acquire", &row.join(" "));
    match row.as_slice() {
        [tag, resumed, cursors @ ..] if tag == "acquired" && (resumed == "0" || resumed == "1") => {
            let cursors = cursors
                .iter()
                .map(|c| if c == "done" { Ok(None) } else { c.parse().map(Some).map_err(|_| bad(&row)) })
                .collect::<RedisResult<_>>()?;
            Ok(Fanout::Acquired { resumed: resumed == "1", cursors })
        }
        [tag, owner] if tag == "held" => Ok(Fanout::Held { owner: owner.clone() }),
        [tag] if tag == "done" => Ok(Fanout::Done),
        _ => Err(bad(&row)),
    }
}

/// What one page of a fan-out did, recorded with the cursor it ended at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FanoutPage {
    pub new: u64,
    pub duplicates: u64,
    pub not_eligible: u64,
    pub scanned: u64,
}

/// Records a page of partition `p` (`cursor` None: the partition is finished) and
/// renews the lease; `false` if the record is no longer the run's owner's.
pub(crate) async fn fanout_progress(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    run: FanoutOf<'_>,
    lease_ms: u64,
    p: u16,
    cursor: Option<u64>,
    page: FanoutPage,
) -> RedisResult<bool> {
    let held: i64 = SCRIPTS
        .fanout
        .key(keys.fanout(run.campaign, run.period))
        .arg("progress")
        .arg(run.owner)
        .arg(lease_ms)
        .arg(p)
        .arg(cursor.map_or("done".to_string(), |c| c.to_string()))
        .arg(page.new)
        .arg(page.duplicates)
        .arg(page.not_eligible)
        .arg(page.scanned)
        .invoke_async(conn)
        .await?;
    flag("fanout.lua progress", held)
}

/// Starts a fan-out still running (record `key`, found by a scan) again from the
/// beginning of every partition; whether it was running.
pub(crate) async fn fanout_rewind(conn: &mut impl ConnectionLike, key: &str, partitions: u16) -> RedisResult<bool> {
    let rewound: i64 = SCRIPTS.fanout.key(key).arg("rewind").arg("").arg(0).arg(partitions).invoke_async(conn).await?;
    flag("fanout.lua rewind", rewound)
}

/// Marks the fan-out done; `false` if the record is no longer the run's owner's.
pub(crate) async fn fanout_finish(conn: &mut impl ConnectionLike, keys: &Keys, run: FanoutOf<'_>) -> RedisResult<bool> {
    let key = keys.fanout(run.campaign, run.period);
    let held: i64 = SCRIPTS.fanout.key(key).arg("finish").arg(run.owner).arg(0).invoke_async(conn).await?;
    flag("fanout.lua finish", held)
}
