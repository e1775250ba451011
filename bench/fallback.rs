//! `bench/fallback [--operators N] [--subscribers M] [--kills K] [--seed S] [--json]`:
//! mail to ourselves must arrive. The emulator refuses the sender domain of the
//! digest and of the operator mail (`acme.example`, `resend.from`); the operator
//! template `new_lead` falls back to `acme-mail.example`. The daemon (the binary)
//! sends M digest emails, M/10 receipts and N operator emails; a fifth of the refusals
//! are answered too late (the client times out, so the refusal that follows is of a
//! request that may have been processed); and each time Redis shows an operator
//! request sealed again from its fallback sender but not sent yet, the daemon is
//! killed with `kill -9` (K times) and started again. Then it counts, from Redis and
//! from the emulator, what went out from which sender. Exits non-zero when customer
//! mail went out from the fallback sender, a fallback followed a timed-out attempt,
//! anything was sent twice, a 256-character key was refused, or the run did not
//! exercise what it is for (no fallback, no customer refusal, no kill between a
//! refusal and its fallback, no refusal after a timeout).

#[path = "process.rs"]
mod process;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::model::work::TRANSACTIONAL;
use mailstream::ops::deliveries::Filter;
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig, Faults};
use serde::Serialize;

const OPERATOR: &str = "oncall@acme.example";
const API_KEY: &str = "re_fallback_bench";
const FALLBACK_DOMAIN: &str = "acme-mail.example";

struct Options {
    operators: u64,
    subscribers: u64,
    kills: u32,
    seed: u64,
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    operator_sent_via_fallback: u64,
    customer_sent_via_fallback: u64,
    customer_failed_sender_rejected: u64,
    maybe_sent_fell_back: u64,
    long_key_ok: bool,
    duplicate_sends: u64,
    /// Operator emails enqueued.
    operator_emails: u64,
    /// Requests refused after the same request timed out (any lane).
    refusals_after_timeout: u64,
    /// Operator emails refused after a request that may have been processed (a timeout,
    /// or a holder killed with it on the wire): settled outcome_unknown, never fallen back.
    operator_outcome_unknown: u64,
    /// kill -9 landed after a fallback was sealed and before its request left.
    kills_between_refusal_and_fallback: u32,
    /// Of those fallbacks, the ones another daemon then sent (once: see duplicate_sends).
    killed_fallbacks_sent: u64,
    never_settled: u64,
    seconds: f64,
}

impl Report {
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                out.push(what.to_string());
            }
        };
        check(self.operator_sent_via_fallback >= 1, "no operator email was sent via its fallback sender");
        check(self.customer_sent_via_fallback == 0, "customer mail went out from the fallback sender");
        check(self.customer_failed_sender_rejected >= 1, "no customer email failed for its refused sender");
        check(self.maybe_sent_fell_back == 0, "a fallback followed a request that may have been processed");
        check(self.long_key_ok, "a 256-character derived key was refused");
        check(self.duplicate_sends == 0, "an email was sent twice");
        check(self.kills_between_refusal_and_fallback >= 1, "no kill landed between a refusal and its fallback");
        check(
            self.killed_fallbacks_sent == u64::from(self.kills_between_refusal_and_fallback),
            "a fallback whose holder was killed was not sent by another",
        );
        check(self.refusals_after_timeout >= 1, "no refusal followed a timed-out request");
        check(
            self.operator_outcome_unknown >= 1,
            "no operator email met a refusal after a request that may have been sent",
        );
        check(self.never_settled == 0, "deliveries were never settled");
        out
    }
}

/// An operator request sealed again from its fallback sender whose request has not
/// left yet (`sealed`, with the refusal it follows), other than those in `seen`.
async fn fallback_waiting(store: &Store, seen: &BTreeSet<String>) -> anyhow::Result<Option<String>> {
    let mut conn = store.conn().await?;
    for p in 0..store.keys.partitions() {
        let ids: Vec<String> =
            redis::cmd("ZRANGE").arg(store.keys.batches(p)).arg(0).arg(-1).query_async(&mut conn).await?;
        for id in ids {
            let (state, fallback): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(store.keys.batch(p, &id))
                .arg("state")
                .arg("fallback_error")
                .query_async(&mut conn)
                .await?;
            if state.as_deref() == Some("sealed") && fallback.is_some() && !seen.contains(&id) {
                return Ok(Some(id));
            }
        }
    }
    Ok(None)
}

/// Whether the emulator takes derived keys of 255 and 256 characters (Resend's limit).
async fn long_keys_taken(emulator_url: &str) -> anyhow::Result<bool> {
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::builder().user_agent("mailstream-bench").build()?;
    let mut ok = true;
    // Two keys apart in their first characters (a derived key keeps the first 247).
    for (len, c) in [(255, "a"), (256, "b")] {
        let key = mailstream::send::fallback::fallback_key(&c.repeat(len));
        ok &= key.chars().count() <= 256;
        let email = serde_json::json!({"from": format!("Ops <ops@{FALLBACK_DOMAIN}>"), "to": "delivered@resend.dev", "subject": format!("key {len}"), "text": "t"});
        let answer = http
            .post(format!("{emulator_url}/emails"))
            .bearer_auth(API_KEY)
            .header("idempotency-key", key)
            .json(&email)
            .send()
            .await?;
        if answer.status() != 200 {
            eprintln!("a derived key of {len} characters was refused: {} {}", answer.status(), answer.text().await?);
            ok = false;
        }
    }
    Ok(ok)
}

async fn run(opts: &Options) -> anyhow::Result<Report> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let emulator = Emulator::new(EmulatorConfig {
        requests_per_second: Some(10),
        seed: opts.seed,
        faults: Faults {
            rejected_sender_domains: vec!["acme.example".into()],
            hang_refusals: 0.2,
            hang_ms: 3000,
            ..Default::default()
        },
        ..Default::default()
    });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;

    let dir = std::env::temp_dir().join(format!("mailstream-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (config_path, log_path) = (dir.join("config.toml"), dir.join("daemon.log"));
    let _ = std::fs::remove_file(&log_path);
    std::fs::write(&config_path, process::config_text(&redis.url(), &emulator_url, &[]))?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new(API_KEY));
    let store = Store::open(&config).await?;

    let subs: Vec<Subscriber> = (0..opts.subscribers).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    let campaign = config.campaign("weekly_digest").context("weekly_digest campaign")?.clone();
    let period = mailstream::audience::kick::period_for(
        &store,
        &campaign,
        None,
        mailstream::audience::kick::PeriodRule::NearNow,
    )
    .await?;
    mailstream::audience::kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    let mut items: Vec<serde_json::Value> = (0..opts.operators)
        .map(|i| serde_json::json!({"idempotency_key": format!("lead-{i}"), "to": OPERATOR, "template": "new_lead", "data": {"company": format!("c{i}")}}))
        .collect();
    items.extend((0..opts.subscribers / 10).map(|i| {
        serde_json::json!({"idempotency_key": format!("order-{i}"), "to": format!("delivered+r{i}@resend.dev"), "template": "receipt"})
    }));
    let day = store.time().await?.format("%Y-%m-%d").to_string();
    mailstream::audience::ingest::enqueue(&store, &config, items).await?;
    if !opts.json {
        eprintln!(
            "fallback: {} digest emails, {} receipts, {} operator emails; sender domain acme.example refused; logs in {}",
            opts.subscribers,
            opts.subscribers / 10,
            opts.operators,
            log_path.display()
        );
    }

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_mailstream"));
    let started = Instant::now();
    let mut daemon = process::spawn_daemon(&binary, &config_path, &log_path, API_KEY)?;
    let (mut kills, mut killed_at) = (0, BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(300);
    let (digest, tx) = loop {
        let digest = store.counts(&campaign.name, &period).await?;
        let tx = store.counts(TRANSACTIONAL, &day).await?;
        if (digest.settled() >= digest.enqueued && tx.settled() >= tx.enqueued) || Instant::now() > deadline {
            break (digest, tx);
        }
        // Each kill at another fallback (the one a killed holder left waits for its lease).
        if kills < opts.kills
            && let Some(batch) = fallback_waiting(&store, &killed_at).await?
        {
            killed_at.insert(batch);
            daemon.kill().context("kill -9 the daemon")?;
            let _ = daemon.wait();
            kills += 1;
            if !opts.json {
                eprintln!(
                    "  [{:5.1}s] kill -9 #{kills}: a fallback was sealed, its request not sent",
                    started.elapsed().as_secs_f64()
                );
            }
            daemon = process::spawn_daemon(&binary, &config_path, &log_path, API_KEY)?;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    let _ = Command::new("kill").arg("-TERM").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();

    // From the delivery log: every transactional delivery (records and settled history).
    let every = Filter { campaign: Some(TRANSACTIONAL.into()), limit: 1000, ..Default::default() };
    let (mut operator_sent_via_fallback, mut operator_outcome_unknown, mut customer_failed) = (0, 0, 0);
    let mut customer_flagged = 0;
    for r in mailstream::ops::deliveries::every(&store, &every).await? {
        let operator = r.target.starts_with("lead-");
        match (operator, r.status.as_str(), r.used_fallback_sender) {
            (true, "sent", true) => operator_sent_via_fallback += 1,
            (true, "outcome_unknown", _) => operator_outcome_unknown += 1,
            (false, _, true) => customer_flagged += 1,
            (false, "failed", _) if r.why.as_deref() == Some("validation_error") => customer_failed += 1,
            _ => {}
        }
    }
    // A fallback sealed when the daemon was killed, then accepted from its derived key.
    let prefix = &config.redis.prefix;
    let killed_fallbacks_sent = killed_at
        .iter()
        .filter(|batch| {
            let key = mailstream::send::fallback::fallback_key(&mailstream::send::seal::idempotency_key(prefix, batch));
            emulator.seen().iter().any(|s| s.status == 200 && s.idempotency_key.as_deref() == Some(key.as_str()))
        })
        .count() as u64;
    // From the emulator: who got mail from the fallback sender, and which keys timed out.
    let accepted = emulator.accepted();
    let from_fallback = |e: &&serde_json::Value| e["from"].as_str().is_some_and(|f| f.contains(FALLBACK_DOMAIN));
    let customer_sent_via_fallback = accepted
        .iter()
        .filter(from_fallback)
        .filter(|e| e["to"].as_array().is_some_and(|to| to.iter().any(|t| t != OPERATOR)))
        .filter(|e| !e["subject"].as_str().is_some_and(|s| s.starts_with("key ")))
        .count() as u64
        + customer_flagged;
    // A refusal answered too late, then the same request again: refused, now after a
    // request that may have been processed.
    let seen = emulator.seen();
    let keys_of = |hung: bool| -> BTreeSet<String> {
        seen.iter().filter(|s| s.hung == hung && s.status == 403).filter_map(|s| s.idempotency_key.clone()).collect()
    };
    let timed_out = keys_of(true);
    let refusals_after_timeout = timed_out.intersection(&keys_of(false)).count() as u64;
    let fell_back: BTreeSet<String> = seen
        .iter()
        .filter_map(|s| s.idempotency_key.as_deref()?.strip_suffix(".fallback").map(str::to_string))
        .collect();
    let long_key_ok = long_keys_taken(&emulator_url).await?;
    let report = Report {
        operator_sent_via_fallback,
        customer_sent_via_fallback,
        customer_failed_sender_rejected: customer_failed,
        maybe_sent_fell_back: timed_out.intersection(&fell_back).count() as u64,
        long_key_ok,
        duplicate_sends: emulator.stats().duplicate_sends,
        operator_emails: opts.operators,
        refusals_after_timeout,
        operator_outcome_unknown,
        kills_between_refusal_and_fallback: kills,
        killed_fallbacks_sent,
        never_settled: (digest.enqueued - digest.settled().min(digest.enqueued))
            + (tx.enqueued - tx.settled().min(tx.enqueued)),
        seconds,
    };
    stop_emulator.trigger();
    let _ = emulator_task.await;
    Ok(report)
}

fn main() -> ExitCode {
    let mut opts = Options { operators: 40, subscribers: 1000, kills: 3, seed: 7, json: false };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--operators" => opts.operators = value("--operators"),
            "--subscribers" => opts.subscribers = value("--subscribers"),
            "--kills" => opts.kills = value("--kills") as u32,
            "--seed" => opts.seed = value("--seed"),
            "--json" => opts.json = true,
            "--bench" => {} // added by `cargo bench`
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let report = match runtime.block_on(run(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if !opts.json {
        eprintln!(
            "fallback: {} of {} operator emails sent via the fallback sender, {} settled outcome_unknown ({} refusals after a timeout, none fallen back: {}); {} customer emails failed sender_rejected, {} via the fallback sender; {} kill -9 between a refusal and its fallback, {} of those fallbacks sent by the next daemon; {} duplicate sends; 256-character key {}; {:.1} s",
            report.operator_sent_via_fallback,
            report.operator_emails,
            report.operator_outcome_unknown,
            report.refusals_after_timeout,
            report.maybe_sent_fell_back == 0,
            report.customer_failed_sender_rejected,
            report.customer_sent_via_fallback,
            report.kills_between_refusal_and_fallback,
            report.killed_fallbacks_sent,
            report.duplicate_sends,
            if report.long_key_ok { "taken" } else { "REFUSED" },
            report.seconds,
        );
    }
    println!("{}", serde_json::to_string(&report).expect("a report serializes"));
    let problems = report.problems();
    for p in &problems {
        eprintln!("FAIL: {p}");
    }
    if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
