//! A short chaos run (the full one is `bench/chaos`): 2000 deliveries against
//! the emulator with 5xx, hangs and a 429 storm, the daemon process killed with
//! SIGKILL three times, Redis restarted once, Resend unreachable for 3 s and a
//! quota pause during which 10 % unsubscribe. Nothing may be sent twice, nothing
//! left unsettled, nobody mailed after unsubscribing.

#[path = "../bench/chaos_run.rs"]
mod chaos_run;

use chaos_run::{ChaosOptions, chaos};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_sends_each_delivery_at_most_once_and_settles_all() {
    let report = chaos(&ChaosOptions {
        deliveries: 2000,
        kills: 3,
        redis_restarts: 1,
        rps: 10,
        seed: 7,
        outage_seconds: 3,
        pause_with_unsubscribes: 0.1,
        binary: env!("CARGO_BIN_EXE_mailstream").into(),
        verbose: false,
    })
    .await
    .expect("the chaos run completes");
    assert_eq!(report.problems(), Vec::<String>::new(), "{report:#?}");
    assert_eq!(report.deliveries, 2000);
    assert_eq!((report.kills, report.redis_restarts), (3, 1));
    assert_eq!(report.sent + report.failed + report.outcome_unknown + report.skipped, 2000, "{report:#?}");
    assert_eq!((report.failed, report.outage_seconds), (0, 3), "{report:#?}");
    assert!(report.unsubscribed_during_pause > 100, "{report:#?}");
    assert_eq!(report.sent_after_unsubscribe, 0, "{report:#?}");
    assert!(report.skipped_reasons.keys().all(|r| r == "unsubscribed"), "{report:#?}");
    assert_eq!(report.duplicate_real_sends, 0);
    // Every sent delivery was really sent once; only an outcome_unknown one may have
    // been sent without the daemon learning of it.
    assert!(report.real_sends >= report.sent, "{report:#?}");
    assert!(report.real_sends <= report.sent + report.outcome_unknown, "{report:#?}");
}
