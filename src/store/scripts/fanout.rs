//! A campaign period's fan-out record (fanout.lua): acquire, progress, rewind, finish.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisResult, ToRedisArgs};

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
    let key = keys.fanout(run.campaign, run.period);
    let own = (if restart { "1" } else { "0" }, keys.partitions(), retention_secs);
    read_acquire(fanout(conn, &key, "acquire", run.owner, lease_ms, own).await?)
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
    let key = keys.fanout(run.campaign, run.period);
    let cursor = cursor.map_or("done".to_string(), |c| c.to_string());
    let own = (p, cursor, page.new, page.duplicates, page.not_eligible, page.scanned);
    flag("fanout.lua progress", fanout(conn, &key, "progress", run.owner, lease_ms, own).await?)
}

/// Starts a fan-out still running (record `key`, found by a scan) again from the
/// beginning of every partition; whether it was running.
pub(crate) async fn fanout_rewind(conn: &mut impl ConnectionLike, key: &str, partitions: u16) -> RedisResult<bool> {
    flag("fanout.lua rewind", fanout(conn, key, "rewind", "", 0, partitions).await?)
}

/// Marks the fan-out done; `false` if the record is no longer the run's owner's.
pub(crate) async fn fanout_finish(conn: &mut impl ConnectionLike, keys: &Keys, run: FanoutOf<'_>) -> RedisResult<bool> {
    let key = keys.fanout(run.campaign, run.period);
    flag("fanout.lua finish", fanout(conn, &key, "finish", run.owner, 0, Vec::<String>::new()).await?)
}

/// One call of fanout.lua on the record `key`: `op` by `owner`, with the op's own
/// arguments (`own`, after the lease).
///
/// Runs `lua/fanout.lua`:
/// ```text
/// KEYS[1] the fan-out record (hash: state running|done, owner, lease_until, c<p> the HSCAN
///   cursor of partition p's audience hash ('done' when finished), new, duplicates,
///   not_eligible, scanned, pages, runs, started_ms, done_ms)
/// ARGV[1] op, ARGV[2] owner, ARGV[3] lease ms
/// 'acquire': ARGV[4] '1' to start again if done (an operator's kick), ARGV[5] partitions,
///   ARGV[6] retention seconds. Returns {'acquired', resumed ('1'|'0'), c0, c1, ...},
///   {'held', owner} while another holder's lease is live, or {'done'}.
/// 'progress': ARGV[4] partition, ARGV[5] its cursor after this page, ARGV[6] new,
///   ARGV[7] duplicates, ARGV[8] not eligible, ARGV[9] subscribers scanned. Returns 1, or 0
///   if the record is no longer this owner's (its lease ran out and another took over).
/// 'finish': returns 1, or 0 if no longer this owner's.
/// 'rewind' (`mailstream upgrade`; owner and lease unused): ARGV[4] partitions. A fan-out still
///   running starts every partition again from the beginning. Returns 1, or 0 if not running.
/// ```
async fn fanout<T: FromRedisValue>(
    conn: &mut impl ConnectionLike,
    key: &str,
    op: &str,
    owner: &str,
    lease_ms: u64,
    own: impl ToRedisArgs,
) -> RedisResult<T> {
    SCRIPTS.fanout.key(key).arg(op).arg(owner).arg(lease_ms).arg(own).invoke_async(conn).await
}
