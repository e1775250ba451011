//! Checks the send protocol's model (`protocol.rs`) exhaustively on the CI bound (and the
//! smaller bounds beside it: a channel's, the history's, the ages', the reseal and the
//! time bounds), then
//! mutants: a mutant is caught when the checker finds a counterexample, printed as the
//! sequence of script calls that leads to it. `cargo test` runs the bound and the
//! required mutants; `bench/model` (`--json --all-mutants --larger`) every mutant and a
//! larger bound explored by random simulation, and prints one line of figures.
//!
//! Exit status: 0 when every property holds on the bound and every required mutant is
//! caught; 1 otherwise.

mod protocol;
mod provider;
mod walk;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use protocol::{Budget, Delivery, Env, Lane, Mutant, Protocol};
use stateright::{Checker, HasDiscoveries, Model, UniformChooser};

/// The mutants the bound must catch (the three named ones, a WAIT answered by
/// another node, which the redis crate's cluster client could do after a failover, a
/// sender fallback after a request that may have been sent, and, on the channel's bound,
/// an application event whose body is written anew or not waited for, on the Web Push
/// bound, browser marks not waited for, on the settled history's bound, a kick whose
/// dedup does not read the history, on the ages' bound, traces that expire the
/// retention after they settled, on the reseal bound, a maybe-sent batch re-sealed
/// without the members who left, and, on the time bound, a batch let through past its
/// delivery deadline, a maybe-sent one settled failed at its deadline, and a request
/// sent on a gate its slot made stale).
const REQUIRED: [Mutant; 14] = [
    Mutant::MissingBatchReadAsSettled,
    Mutant::CommitBeforeReplicas,
    Mutant::LaneSkipsSuppression,
    Mutant::WaitAnsweredElsewhere,
    Mutant::FallbackAfterMaybeSent,
    Mutant::AppBodyRewritten,
    Mutant::AppBodyNotWaited,
    Mutant::PushMarksNotWaited,
    Mutant::KickForgetsSettledHistory,
    Mutant::ExpiryFromSettlement,
    Mutant::ResealMaybeSent,
    Mutant::GateSkipsDeadline,
    Mutant::DeadlineFailsMaybeSent,
    Mutant::SendsOnStaleGate,
];

/// The CI bound: 2 deliveries (a campaign delivery whose address the render hook
/// supplies, in partition 0; operator mail to an inline address, in partition 1), 2 holders,
/// 2 partitions on 2 nodes, both environments; at most one crash, one stall, one
/// failover, one unsubscribe, one suppression, one provider answer other than an
/// acceptance, and one passing of the resend window.
fn ci_bound(mutant: Option<Mutant>) -> Protocol {
    Protocol {
        deliveries: vec![
            Delivery { partition: 0, lane: Lane::Digest, address: 0, registry: false, operator: false, sibling: None },
            Delivery {
                partition: 1,
                lane: Lane::Transactional,
                address: 1,
                registry: false,
                operator: true,
                sibling: None,
            },
        ],
        partitions: 2,
        budget: Budget {
            kicks: 1,
            crashes: 1,
            stalls: 1,
            failovers: 1,
            unsubscribes: 1,
            suppressions: 1,
            failures: 1,
            wait_failures: 0,
            windows: 1,
            pauses: 0,
            ticks: 0,
            deadlines: 0,
            stales: 0,
        },
        envs: vec![Env::Replicated, Env::LostWrites],
        mutant,
        liveness: true,
    }
}

/// The application channel's bound: one subscriber's email and application event,
/// enqueued together by one kick, in partition 0, 2 holders, a replicated Redis; at most
/// one stall (a holder that may never resume: it stands for a crash too, and it may also
/// come back and post late), one failover, one unsubscribe (of the event's channel), and
/// two answers other than an acceptance (an event put off, or its answer lost).
fn channel_bound(mutant: Option<Mutant>) -> Protocol {
    Protocol {
        deliveries: vec![
            Delivery {
                partition: 0,
                lane: Lane::Digest,
                address: 0,
                registry: true,
                operator: false,
                sibling: Some(1),
            },
            Delivery { partition: 0, lane: Lane::App, address: 0, registry: true, operator: false, sibling: Some(0) },
        ],
        partitions: 1,
        budget: Budget {
            kicks: 1,
            crashes: 0,
            stalls: 1,
            failovers: 1,
            unsubscribes: 1,
            suppressions: 0,
            failures: 2,
            wait_failures: 0,
            windows: 0,
            pauses: 0,
            ticks: 0,
            deadlines: 0,
            stales: 0,
        },
        envs: vec![Env::Replicated],
        mutant,
        liveness: true,
    }
}

/// The Web Push channel's bound: the application channel's, with a Web Push delivery in
/// place of the application event; its subscriber has two browsers, one of them gone, and
/// one answer other than an acceptance (5xx, an answer lost, an unsubscribe).
fn push_bound(mutant: Option<Mutant>) -> Protocol {
    let mut m = channel_bound(mutant);
    m.deliveries[1].lane = Lane::Push;
    // One answer other than an acceptance: each browser's answers multiply the paths.
    m.budget.failures = 1;
    m
}

/// The settled history's bound: one subscriber's email and application event, kicked
/// twice (the second kick may come after either settled compactly), one holder, one
/// partition, no trouble.
fn history_bound(mutant: Option<Mutant>) -> Protocol {
    let mut m = channel_bound(mutant);
    m.budget = Budget {
        kicks: 2,
        crashes: 0,
        stalls: 0,
        failovers: 0,
        unsubscribes: 0,
        suppressions: 0,
        failures: 0,
        wait_failures: 0,
        windows: 0,
        pauses: 0,
        ticks: 0,
        deadlines: 0,
        stales: 0,
    };
    m
}

/// The ages' bound: the settled history's, with Redis's clock moving on four steps (past
/// the period's kick window, which ends at 3): the email and its event kicked twice, at
/// any age from early (before the period starts) to the last moment of the window.
fn aging_bound(mutant: Option<Mutant>) -> Protocol {
    let mut m = history_bound(mutant);
    m.budget.ticks = 4;
    m
}

/// The bound a mutant is checked on: the channel's for the channel's mutants, the
/// settled history's for its own, the ages' for theirs.
fn bound_for(mutant: Mutant) -> Protocol {
    match mutant {
        Mutant::KickForgetsSettledHistory => history_bound(Some(mutant)),
        Mutant::ExpiryFromSettlement => aging_bound(Some(mutant)),
        Mutant::ResealMaybeSent => reseal_bound(Some(mutant)),
        m if m.is_time() => time_bound(Some(mutant)),
        m if m.is_channel() => channel_bound(Some(mutant)),
        m if m.is_push() => push_bound(Some(mutant)),
        _ => ci_bound(Some(mutant)),
    }
}

/// Two deliveries that share a batch: a campaign delivery to its registry address and a
/// receipt, in partition 0 (the gate can re-seal one without the other).
fn one_batch() -> [Delivery; 2] {
    let receipt = Delivery {
        partition: 0,
        lane: Lane::Transactional,
        address: 1,
        registry: false,
        operator: false,
        sibling: None,
    };
    [Delivery { partition: 0, lane: Lane::Digest, address: 0, registry: true, operator: false, sibling: None }, receipt]
}

/// The reseal bound (#59), exhaustive, for `bench/model`: two deliveries in one batch (a
/// campaign delivery to its registry address and a receipt, partition 0), so the last gate
/// re-seals without one of them; two provider failures on one path (a timeout then a
/// refusal), a WAIT not acknowledged, a quota pause, each delivery kicked twice, a crash,
/// an unsubscribe and a suppression; a replicated Redis.
fn reseal_bound(mutant: Option<Mutant>) -> Protocol {
    let mut m = ci_bound(mutant);
    m.deliveries = one_batch().to_vec();
    m.partitions = 1;
    m.budget = Budget {
        kicks: 2,
        crashes: 1,
        stalls: 0,
        failovers: 0,
        unsubscribes: 1,
        suppressions: 1,
        failures: 2,
        wait_failures: 1,
        windows: 0,
        pauses: 1,
        ticks: 0,
        deadlines: 0,
        stales: 0,
    };
    m.envs = vec![Env::Replicated];
    m
}

/// The time bound (#59), exhaustive in `cargo test`: the two deliveries of one batch (the
/// reseal bound's), with time passing where the code reads it: the batch's delivery
/// deadline and its keys' maybe-sent deadlines pass, a holder's slot moves past its gate's
/// freshness (it looks again), and a holder's heartbeat is slow (a stall: its leases run
/// out while it runs, another takes over, it goes on where it was); one provider answer
/// other than an acceptance and a suppression.
fn time_bound(mutant: Option<Mutant>) -> Protocol {
    let mut m = reseal_bound(mutant);
    m.budget = Budget {
        kicks: 1,
        crashes: 0,
        stalls: 1,
        failovers: 0,
        unsubscribes: 0,
        suppressions: 1,
        failures: 1,
        wait_failures: 0,
        windows: 0,
        pauses: 0,
        ticks: 0,
        deadlines: 2,
        stales: 1,
    };
    m
}

/// The time bound widened for `bench/model`: the resend window passes too, and a member
/// unsubscribes.
fn wide_time_bound() -> Protocol {
    let mut m = time_bound(None);
    m.budget.windows = 1;
    m.budget.unsubscribes = 1;
    m
}

/// A larger bound, explored by random simulation: a campaign delivery to its registry
/// address and a receipt sharing partition 0 (one batch, so the gate reseals), a hook's
/// address in partition 1; each delivery kicked twice, a WAIT not acknowledged, a quota
/// pause, and two of most other kinds of trouble.
fn larger_bound() -> Protocol {
    let mut m = ci_bound(None);
    let [digest, receipt] = one_batch();
    m.deliveries = vec![
        digest,
        receipt,
        Delivery { partition: 1, lane: Lane::Digest, address: 2, registry: false, operator: false, sibling: None },
        Delivery {
            partition: 1,
            lane: Lane::Transactional,
            address: 3,
            registry: false,
            operator: true,
            sibling: None,
        },
    ];
    m.budget = Budget {
        kicks: 2,
        crashes: 1,
        stalls: 2,
        failovers: 2,
        unsubscribes: 2,
        suppressions: 2,
        failures: 2,
        wait_failures: 1,
        windows: 2,
        pauses: 1,
        ticks: 0,
        deadlines: 0,
        stales: 0,
    };
    m.liveness = false;
    m
}

struct Run {
    states: usize,
    depth: usize,
    seconds: f64,
    /// Property → its counterexample as script calls (none: it holds).
    failures: BTreeMap<&'static str, Vec<String>>,
    properties: Vec<&'static str>,
}

impl Run {
    fn of(checker: &impl Checker<Protocol>, started: Instant) -> Run {
        let mut failures = BTreeMap::new();
        for (name, path) in checker.discoveries() {
            let steps = path.into_actions().iter().map(|a| checker.model().format_action(a)).collect();
            failures.insert(name, steps);
        }
        Run {
            states: checker.unique_state_count(),
            depth: checker.max_depth(),
            seconds: started.elapsed().as_secs_f64(),
            failures,
            properties: checker.model().properties().iter().map(|p| p.name).collect(),
        }
    }
}

/// Explores the bound exhaustively: depth first, one of each two states that differ only
/// by which holder is which (the holders are alike), until a property fails or nothing is
/// left.
fn check(model: Protocol) -> Run {
    let started = Instant::now();
    let builder = model.checker().threads(2).finish_when(HasDiscoveries::AnyFailures);
    let checker = builder.symmetry_fn(protocol::representative).spawn_dfs().join();
    Run::of(&checker, started)
}

/// Explores a mutant as the bound is explored; once caught, again breadth first, for its
/// shortest counterexample (a breadth-first search holds every state of a level, so it is
/// kept for mutants that are caught early).
fn check_mutant(model: Protocol) -> Run {
    let run = check(model.clone());
    if run.failures.is_empty() {
        return run;
    }
    let started = Instant::now();
    let checker = model.checker().threads(2).finish_when(HasDiscoveries::AnyFailures).spawn_bfs().join();
    Run::of(&checker, started)
}

/// The walks' bound, on one server (no lag, failover or WAIT refusal): five deliveries
/// over two partitions (registry, hook and inline addresses; both lanes in each), a
/// crash, and a few of every other trouble.
fn walk_bound() -> Protocol {
    let mut m = larger_bound();
    let [digest, receipt] = one_batch();
    m.deliveries = vec![
        digest,
        receipt,
        Delivery { partition: 0, lane: Lane::Digest, address: 2, registry: false, operator: false, sibling: None },
        Delivery { partition: 1, lane: Lane::Digest, address: 3, registry: true, operator: false, sibling: None },
        Delivery {
            partition: 1,
            lane: Lane::Transactional,
            address: 4,
            registry: false,
            operator: true,
            sibling: None,
        },
        Delivery { partition: 1, lane: Lane::App, address: 3, registry: true, operator: false, sibling: None },
        Delivery { partition: 0, lane: Lane::Push, address: 0, registry: true, operator: false, sibling: None },
    ];
    m.budget = Budget {
        kicks: 2,
        crashes: 1,
        stalls: 3,
        failovers: 0,
        unsubscribes: 3,
        suppressions: 3,
        failures: 4,
        wait_failures: 0,
        windows: 2,
        pauses: 2,
        ticks: 0,
        deadlines: 2,
        stales: 2,
    };
    m.envs = vec![Env::Replicated];
    m
}

/// Conformance: `walks` seeded random walks of at most `length` steps each, executed
/// against a real redis-server. Returns (steps, walks, the first mismatch).
fn conform(walks: u64, length: usize) -> (usize, u64, Option<walk::Mismatch>) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let walker = walk::Walker::start(walk_bound()).await.expect("a redis-server for the walks");
        let mut steps = 0;
        for seed in 0..walks {
            match walker.walk(seed, length).await.expect("Redis answers") {
                Ok(n) => steps += n,
                Err(mismatch) => return (steps, seed + 1, Some(mismatch)),
            }
        }
        (steps, walks, None)
    })
}

fn print_trace(title: &str, property: &str, steps: &[String]) {
    eprintln!("{title}: {property} fails after {} steps:", steps.len());
    for (i, step) in steps.iter().enumerate() {
        eprintln!("  {:>2}. {step}", i + 1);
    }
}

/// Explores `model` exhaustively, saying how far (`what`: the bound, in words) and printing
/// each counterexample found.
fn explore(model: Protocol, what: &str) -> Run {
    let run = check(model);
    eprintln!("model: {} states, depth {}, {:.1} s ({what})", run.states, run.depth, run.seconds);
    for (property, steps) in &run.failures {
        print_trace(what, property, steps);
    }
    run
}

/// One bound, exhaustively, and the mutant it must catch (a `--…-only` run while working on
/// one part): success when every property holds and the mutant is caught.
fn one_bound(name: &str, bound: fn(Option<Mutant>) -> Protocol, mutant: Mutant) -> ExitCode {
    let run = explore(bound(None), &format!("{name}, exhaustive"));
    let caught = check_mutant(bound(Some(mutant)));
    match caught.failures.iter().next() {
        Some((property, steps)) => print_trace(&format!("mutant {} caught", mutant.name()), property, steps),
        None => eprintln!("mutant {}: missed ({} states)", mutant.name(), caught.states),
    }
    if run.failures.is_empty() && !caught.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    // `cargo test` passes the harness's own flags (--quiet, a filter): they are ignored.
    let (json, all_mutants, larger) = (flag("--json"), flag("--all-mutants"), flag("--larger"));

    if flag("--ages-only") {
        // While working on the kick window and the dedup's expiry.
        return one_bound("the ages' bound", aging_bound, Mutant::ExpiryFromSettlement);
    }
    if flag("--time-only") {
        // The time bound and one of its mutants alone (#59).
        return one_bound("the time bound", time_bound, Mutant::GateSkipsDeadline);
    }
    if flag("--reseal-only") {
        // The reseal bound and its mutant alone (#59).
        return one_bound("the reseal bound", reseal_bound, Mutant::ResealMaybeSent);
    }
    let (walks, length) = if larger { (2000, 150) } else { (600, 150) };
    let started = Instant::now();
    let (steps, walked, mismatch) = conform(walks, length);
    eprintln!(
        "conformance: {steps} steps in {walked} walks against redis-server, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(m) = &mismatch {
        eprintln!(
            "conformance: the code and the model differ in partition {} after walk {} (seed {}):",
            m.partition, walked, m.seed
        );
        for (i, step) in m.steps.iter().enumerate() {
            eprintln!("  {:>3}. {step}", i + 1);
        }
        eprintln!("  model: {}\n  code:  {}", m.model, m.code);
    }
    if flag("--push-only") {
        // While working on the Web Push channel.
        return one_bound("the Web Push channel's bound", push_bound, Mutant::PushMarksNotWaited);
    }
    if flag("--walks-only") {
        // While working on the scripts or the walks: only them.
        return if mismatch.is_none() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let base = explore(ci_bound(None), "the CI bound, exhaustive, both environments");
    let channel = explore(channel_bound(None), "the application channel's bound, exhaustive");
    let push = explore(push_bound(None), "the Web Push channel's bound, exhaustive");
    let history = explore(history_bound(None), "the settled history's bound, exhaustive");
    let aging = explore(aging_bound(None), "the ages' bound: kick, settle and expiry on one clock, exhaustive");
    let reseal = explore(reseal_bound(None), "the reseal bound: two members in one batch, compound faults, exhaustive");
    let time = explore(time_bound(None), "the time bound: deadlines, a slow heartbeat, a stale gate, exhaustive");
    // Wider, for bench/model: the resend window and an unsubscribe too.
    let wide_time = larger.then(|| explore(wide_time_bound(), "the wide time bound, exhaustive"));
    let mut mutants = BTreeMap::new();
    for mutant in Mutant::ALL.into_iter().filter(|m| all_mutants || REQUIRED.contains(m)) {
        let run = check_mutant(bound_for(mutant));
        let caught = !run.failures.is_empty();
        match run.failures.iter().next() {
            Some((property, steps)) => print_trace(&format!("mutant {} caught", mutant.name()), property, steps),
            None => eprintln!("mutant {}: missed ({} states)", mutant.name(), run.states),
        }
        mutants.insert(mutant.name(), if caught { "caught" } else { "missed" });
    }
    let larger_report = larger.then(|| {
        let started = Instant::now();
        let checker = larger_bound()
            .checker()
            .threads(2)
            .timeout(Duration::from_secs(120))
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_simulation(7, UniformChooser)
            .join();
        let run = Run::of(&checker, started);
        for (property, steps) in &run.failures {
            print_trace("the larger bound", property, steps);
        }
        eprintln!(
            "larger bound: {} states by random simulation, depth {}, {:.1} s",
            run.states, run.depth, run.seconds
        );
        let properties: BTreeMap<&str, bool> =
            run.properties.iter().map(|&p| (p, !run.failures.contains_key(p))).collect();
        serde_json::json!({
            "kind": "random simulation (seed 7, 120 s): 3 deliveries, 2 of most troubles; safety properties",
            "states": run.states,
            "depth": run.depth,
            "seconds": run.seconds,
            "properties": properties,
        })
    });

    let properties: BTreeMap<&str, bool> =
        base.properties.iter().map(|&p| (p, !base.failures.contains_key(p))).collect();
    let missed_required: Vec<&str> =
        REQUIRED.iter().map(|m| m.name()).filter(|name| mutants[name] != "caught").collect();
    if json {
        let line = serde_json::json!({
            "states": base.states,
            "depth": base.depth,
            "seconds": base.seconds,
            "channel_states": channel.states,
            "channel_seconds": channel.seconds,
            "push_states": push.states,
            "push_seconds": push.seconds,
            "history_states": history.states,
            "aging_states": aging.states,
            "reseal_states": reseal.states,
            "reseal_seconds": reseal.seconds,
            "time_states": time.states,
            "time_seconds": time.seconds,
            "wide_time_states": wide_time.as_ref().map(|r| r.states),
            "wide_time_seconds": wide_time.as_ref().map(|r| r.seconds),
            "properties": properties,
            "mutants": mutants,
            "larger": larger_report,
            "conformance_steps": steps,
            "conformance_walks": walked,
            "conformance_mismatches": usize::from(mismatch.is_some()),
        });
        println!("{line}");
    }
    if !missed_required.is_empty() {
        eprintln!("required mutants missed: {missed_required:?}");
    }
    let larger_ok = larger_report
        .as_ref()
        .is_none_or(|r| r["properties"].as_object().is_some_and(|p| p.values().all(|v| v == true)));
    let bounds_hold = base.failures.is_empty()
        && channel.failures.is_empty()
        && push.failures.is_empty()
        && history.failures.is_empty()
        && aging.failures.is_empty()
        && reseal.failures.is_empty()
        && time.failures.is_empty()
        && wide_time.as_ref().is_none_or(|r| r.failures.is_empty());
    if bounds_hold && missed_required.is_empty() && larger_ok && mismatch.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
