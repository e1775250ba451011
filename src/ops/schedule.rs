//! Campaigns that run themselves. A campaign's `schedule` is a cron expression in
//! its `time_zone` (croner; DST as the wall clock has it: a time skipped by a
//! spring-forward fires once, at the first instant after the gap; a repeated hour
//! fires once). `mailstream run` looks every second, on Redis's clock: the latest
//! fire at or before now is due while it is younger than `catch_up_hours` (so a
//! fire missed while no daemon ran is caught up at start) and missed after that
//! (logged and counted once, while its period is still within the retention; a fire
//! before the deployment's first `run` is not missed: nobody was to send it). A due
//! fire kicks its period through the period's fan-out record, so of several instances
//! one fans out and the others stand by, and a fan-out that died halfway resumes. Also
//! the release time of a delivery sent at its recipient's local hour. And the SLO
//! report by email, once per fire of `[slo.report] schedule` (`slo_mail.rs`).
//!
//! Raw Redis here: one read-only EXISTS, whether a period's kick record is there; every write goes
//! through `store::scripts`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::Serialize;

use crate::audience::kick::{self, FanoutOptions};
use crate::config::{CampaignConfig, SloReportConfig, parse_cron};
use crate::ops::slo_mail;
use crate::send::ctx::Ctx;
use crate::store::scripts::{Fanout, FanoutOf};

/// The name the SLO report's fires are remembered under.
const SLO_REPORT: &str = "slo.report";

/// A campaign's schedule in its zone.
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

/// One fire: when, and which period it kicks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Fire {
    /// In the campaign's zone, RFC 3339 with its offset.
    pub local: String,
    pub utc: String,
    pub period: String,
}

/// What a scheduler should do about a campaign now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SchedulePlan {
    /// No fire yet, ever.
    Idle,
    /// Kick `period` for the fire at `at`; `late` when it is a catch-up (more than a
    /// minute after its time).
    Due { at: DateTime<Utc>, period: String, late: bool },
    /// The latest fire is older than the catch-up window.
    Missed { at: DateTime<Utc>, period: String },
}

impl Schedule {
    /// `None` for a campaign without a schedule.
    pub fn of(campaign: &CampaignConfig) -> anyhow::Result<Option<Schedule>> {
        let Some(expr) = campaign.schedule.as_deref() else { return Ok(None) };
        Ok(Some(Schedule { cron: parse_cron(expr)?, tz: campaign.tz() }))
    }

    /// The SLO report's schedule; `None` without one.
    fn of_report(report: &SloReportConfig) -> anyhow::Result<Option<Schedule>> {
        let Some(expr) = report.schedule.as_deref() else { return Ok(None) };
        Ok(Some(Schedule { cron: parse_cron(expr)?, tz: report.tz() }))
    }

    /// The first fire after `t` (`inclusive`: at `t` counts).
    fn next_after(&self, t: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        let t = whole_seconds(t).with_timezone(&self.tz);
        self.cron.find_next_occurrence(&t, inclusive).ok().map(|d| d.with_timezone(&Utc))
    }

    /// The latest fire at or before `t`.
    fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = whole_seconds(t).with_timezone(&self.tz);
        self.cron.find_previous_occurrence(&t, true).ok().map(|d| d.with_timezone(&Utc))
    }

    /// The next `n` fires after `now`, with the period each kicks.
    pub(crate) fn fires(&self, campaign: &CampaignConfig, now: DateTime<Utc>, n: usize) -> Vec<Fire> {
        let mut out = Vec::new();
        let mut t = now;
        while out.len() < n {
            let Some(at) = self.next_after(t, false) else { break };
            out.push(Fire {
                local: at.with_timezone(&self.tz).to_rfc3339(),
                utc: at.to_rfc3339(),
                period: campaign.period.period_at(at, self.tz),
            });
            t = at;
        }
        out
    }

    /// What to do at `now` for `campaign`.
    fn plan(&self, campaign: &CampaignConfig, now: DateTime<Utc>) -> SchedulePlan {
        let Some(at) = self.latest_at_or_before(now) else { return SchedulePlan::Idle };
        let period = campaign.period.period_at(at, self.tz);
        let age = now - at;
        if age <= chrono::Duration::hours(campaign.catch_up_hours as i64) {
            SchedulePlan::Due { at, period, late: age > chrono::Duration::minutes(1) }
        } else {
            SchedulePlan::Missed { at, period }
        }
    }
}

/// `t` without its fraction of a second (croner keeps the start's fraction).
fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// The scheduler of a running daemon.
pub(crate) struct Scheduler {
    ctx: Arc<Ctx>,
    /// Fires this process reported as missed or stood by for (once each).
    reported: HashSet<(String, String, &'static str)>,
    /// Fan-outs this process is running now.
    running: Arc<Mutex<HashSet<(String, String)>>>,
    /// When the deployment's first scheduler looked ([`crate::store::Store::first_run`]),
    /// read at this one's first look.
    first_run: Option<DateTime<Utc>>,
}

impl Scheduler {
    pub fn new(ctx: Arc<Ctx>) -> Scheduler {
        Scheduler { ctx, reported: HashSet::new(), running: Default::default(), first_run: None }
    }

    /// Looks every `tick` until shutdown.
    pub async fn run(mut self, tick: Duration) {
        let schedules: HashMap<String, Schedule> = self
            .ctx
            .config
            .campaigns
            .iter()
            .filter_map(|c| Schedule::of(c).ok().flatten().map(|s| (c.name.clone(), s)))
            .collect();
        let report = Schedule::of_report(&self.ctx.config.slo.report).ok().flatten();
        if schedules.is_empty() && report.is_none() {
            return;
        }
        let mut shutdown = self.ctx.shutdown.clone();
        loop {
            // One read of Redis's clock a look, for the campaigns and the report alike.
            let now = match self.ctx.store.time().await {
                Ok(now) => Some(now),
                Err(e) => {
                    self.ctx.metrics.redis_error("schedule", &e);
                    None
                }
            };
            if let Some(now) = now {
                if let Err(e) = self.look(&schedules, now).await {
                    self.ctx.metrics.redis_error("schedule", &e);
                }
                if let Some(report) = &report
                    && let Err(e) = self.report(report, now).await
                {
                    self.ctx.metrics.redis_error("schedule", &e);
                }
            }
            if !shutdown.sleep(tick).await {
                return;
            }
        }
    }

    async fn look(&mut self, schedules: &HashMap<String, Schedule>, now: DateTime<Utc>) -> anyhow::Result<()> {
        let ctx = self.ctx.clone();
        let first_run = match self.first_run {
            Some(first) => first,
            None => *self.first_run.insert(ctx.store.first_run(now).await?),
        };
        for c in &ctx.config.campaigns {
            let Some(schedule) = schedules.get(&c.name) else { continue };
            let last = schedule.latest_at_or_before(now);
            ctx.metrics.schedule_times(&c.name, last, schedule.next_after(now, false));
            match schedule.plan(c, now) {
                SchedulePlan::Idle => {}
                SchedulePlan::Due { at, period, late } => self.due(c, at, period, late).await?,
                // A fire before the deployment's first run was nobody's to send.
                SchedulePlan::Missed { at, .. } if at < first_run => {}
                SchedulePlan::Missed { at, period } => {
                    let key = (c.name.clone(), period.clone(), "missed");
                    if self.reported.contains(&key) {
                        continue;
                    }
                    // A period whose kick window has ended cannot be kicked any more: not news.
                    let kickable = match kick::open_window(&ctx.store, &ctx.config, c, &period).await {
                        Ok(_) => true,
                        Err(e) if e.downcast_ref::<kick::PeriodClosed>().is_some() => false,
                        Err(e) => return Err(e),
                    };
                    self.reported.insert(key);
                    if kickable {
                        let mut conn = ctx.store.conn().await?;
                        let kicked: bool = redis::cmd("EXISTS")
                            .arg(ctx.store.keys.fanout(&c.name, &period))
                            .query_async(&mut conn)
                            .await?;
                        if !kicked {
                            tracing::warn!(
                                campaign = %c.name,
                                period = %period,
                                fire = %at.to_rfc3339(),
                                catch_up_hours = c.catch_up_hours,
                                "a scheduled fire was missed (no daemon ran within the catch-up window); kick it by hand if it should still go out"
                            );
                            ctx.metrics.schedule_fire(&c.name, "missed");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Enqueues the SLO report of the latest fire, while it is within the catch-up window
    /// and this process has not done so yet (another instance may have: the report's
    /// keys are named by the fire, so the second enqueue adds nothing).
    async fn report(&mut self, schedule: &Schedule, now: DateTime<Utc>) -> anyhow::Result<()> {
        let ctx = self.ctx.clone();
        let Some(at) = schedule.latest_at_or_before(now) else { return Ok(()) };
        if now - at > chrono::Duration::hours(i64::from(ctx.config.slo.report.catch_up_hours)) {
            return Ok(());
        }
        let name = at.format("%Y%m%dT%H%M%SZ").to_string();
        let done = (SLO_REPORT.to_string(), name.clone(), "enqueued");
        if self.reported.contains(&done) {
            return Ok(());
        }
        let enqueued = slo_mail::enqueue(&ctx.store, &ctx.config, &name).await?;
        tracing::info!(
            report = %name,
            status = enqueued.report.status,
            operators = ctx.config.operators.to.len(),
            enqueued_now = enqueued.accepted(),
            "SLO report for this fire enqueued (by this instance or another)"
        );
        self.reported.insert(done);
        Ok(())
    }

    /// Kicks `period` unless it is done, running here, or running elsewhere.
    async fn due(&mut self, c: &CampaignConfig, at: DateTime<Utc>, period: String, late: bool) -> anyhow::Result<()> {
        let key = (c.name.clone(), period.clone());
        if self.running.lock().expect("running lock").contains(&key) {
            return Ok(());
        }
        let ctx = self.ctx.clone();
        // A catch-up obeys the kick window as any kick does (and enqueue.lua checks it again).
        if let Err(e) = kick::open_window(&ctx.store, &ctx.config, c, &period).await {
            if e.downcast_ref::<kick::PeriodClosed>().is_none() {
                return Err(e);
            }
            if self.reported.insert((c.name.clone(), period.clone(), "closed")) {
                tracing::warn!(campaign = %c.name, period = %period, fire = %at.to_rfc3339(), "scheduled fire not kicked: {e}");
                ctx.metrics.schedule_fire(&c.name, "missed");
            }
            return Ok(());
        }
        let (resumed, cursors) = match kick::acquire(
            &ctx.store,
            &ctx.config,
            FanoutOf { campaign: &c.name, period: &period, owner: &ctx.owner },
            false,
        )
        .await?
        {
            Fanout::Done => return Ok(()),
            Fanout::Held { owner } => {
                if self.reported.insert((c.name.clone(), period.clone(), "standby")) {
                    tracing::info!(campaign = %c.name, period = %period, holder = %owner, "scheduled kick running elsewhere; standing by");
                    ctx.metrics.schedule_fire(&c.name, "standby");
                }
                return Ok(());
            }
            Fanout::Acquired { resumed, cursors } => (resumed, cursors),
        };
        self.running.lock().expect("running lock").insert(key.clone());
        let (running, name) = (self.running.clone(), c.name.clone());
        tokio::spawn(async move {
            let options = FanoutOptions::default();
            let run = FanoutOf { campaign: &name, period: &period, owner: &ctx.owner };
            let report = kick::fan_out(&ctx.store, &ctx.config, run, resumed, cursors, &options).await;
            running.lock().expect("running lock").remove(&key);
            match report {
                Ok(r) if !r.abandoned => {
                    tracing::info!(
                        campaign = %name,
                        period = %period,
                        fire = %at.to_rfc3339(),
                        new = r.new,
                        duplicates = r.duplicates,
                        not_eligible = r.not_eligible,
                        resumed = r.resumed,
                        late,
                        "scheduled kick done"
                    );
                    ctx.metrics.schedule_fire(&name, if late { "caught_up" } else { "fired" });
                }
                Ok(_) => {}
                Err(e) => ctx.metrics.redis_error("schedule", &e),
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_local_time;
    use crate::model::period::release_at;

    fn campaign(schedule: &str, tz: &str) -> CampaignConfig {
        let mut c = crate::config::Config::example().campaigns[0].clone();
        c.schedule = Some(schedule.into());
        c.time_zone = tz.into();
        c
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn fires_monday_0900_tokyo_and_not_before() {
        let c = campaign("0 9 * * MON", "Asia/Tokyo");
        let s = Schedule::of(&c).unwrap().unwrap();
        // Monday 2026-11-30 09:00 JST is 00:00 UTC.
        assert_eq!(
            s.plan(&c, at("2026-11-29T23:59:59Z")),
            SchedulePlan::Missed { at: at("2026-11-23T00:00:00Z"), period: "2026-W48".into() }
        );
        assert_eq!(
            s.plan(&c, at("2026-11-30T00:00:00Z")),
            SchedulePlan::Due { at: at("2026-11-30T00:00:00Z"), period: "2026-W49".into(), late: false }
        );
        let fires = s.fires(&c, at("2026-11-29T00:00:00Z"), 3);
        assert_eq!(fires[0].utc, "2026-11-30T00:00:00+00:00");
        assert_eq!(fires[0].local, "2026-11-30T09:00:00+09:00");
        assert_eq!(fires[0].period, "2026-W49");
        assert_eq!(fires[2].utc, "2026-12-14T00:00:00+00:00");
    }

    #[test]
    fn catch_up_within_the_window_and_missed_beyond_it() {
        let c = campaign("0 9 * * MON", "Asia/Tokyo");
        let s = Schedule::of(&c).unwrap().unwrap();
        let within = s.plan(&c, at("2026-11-30T05:59:00Z"));
        assert_eq!(within, SchedulePlan::Due { at: at("2026-11-30T00:00:00Z"), period: "2026-W49".into(), late: true });
        let beyond = s.plan(&c, at("2026-11-30T06:00:01Z"));
        assert_eq!(beyond, SchedulePlan::Missed { at: at("2026-11-30T00:00:00Z"), period: "2026-W49".into() });
    }

    #[test]
    fn new_york_fires_once_across_both_dst_changes() {
        // 2026: spring forward Sunday March 8 (02:00 -> 03:00), fall back Sunday
        // November 1 (02:00 -> 01:00).
        let c = campaign("30 2 * * *", "America/New_York");
        let s = Schedule::of(&c).unwrap().unwrap();
        // One fire on each day around the change, none twice.
        let days: Vec<String> =
            s.fires(&c, at("2026-03-07T00:00:00Z"), 4).into_iter().map(|f| f.local[..10].to_string()).collect();
        assert_eq!(days, ["2026-03-07", "2026-03-08", "2026-03-09", "2026-03-10"]);
        let fall = s.fires(&c, at("2026-10-31T00:00:00Z"), 3);
        let days: Vec<&str> = fall.iter().map(|f| &f.local[..10]).collect();
        assert_eq!(days, ["2026-10-31", "2026-11-01", "2026-11-02"]);
        assert_eq!(fall[1].local, "2026-11-01T02:30:00-05:00");
        // 01:30 happens twice on the fall-back day; it fires once.
        let c = campaign("30 1 * * *", "America/New_York");
        let s = Schedule::of(&c).unwrap().unwrap();
        let days: Vec<String> =
            s.fires(&c, at("2026-10-31T12:00:00Z"), 3).into_iter().map(|f| f.local[..10].to_string()).collect();
        assert_eq!(days, ["2026-11-01", "2026-11-02", "2026-11-03"]);
    }

    #[test]
    fn local_hours_release_at_nine_in_each_zone_within_the_period() {
        let nine = parse_local_time("09:00").unwrap();
        // Kicked Monday 2026-11-30 00:00 UTC (09:00 JST); the ISO week ends Monday
        // 2026-12-07 00:00 JST.
        let (from, until) = (at("2026-11-30T00:00:00Z"), at("2026-12-06T15:00:00Z"));
        let release = |tz: &str| release_at(nine, tz.parse().unwrap(), from, until).to_rfc3339();
        assert_eq!(release("Asia/Tokyo"), "2026-11-30T00:00:00+00:00");
        assert_eq!(release("Europe/Berlin"), "2026-11-30T08:00:00+00:00");
        assert_eq!(release("America/Los_Angeles"), "2026-11-30T17:00:00+00:00");
        // Past the period's end: at once.
        let late = at("2026-12-06T14:00:00Z");
        assert_eq!(release_at(nine, "America/Los_Angeles".parse().unwrap(), late, until), late);
        // A local hour skipped by DST: the first instant after the gap.
        let gap = release_at(
            parse_local_time("02:30").unwrap(),
            chrono_tz::America::New_York,
            at("2026-03-08T05:00:00Z"),
            at("2026-03-20T00:00:00Z"),
        );
        assert_eq!(gap.to_rfc3339(), "2026-03-08T07:30:00+00:00");
    }
}
