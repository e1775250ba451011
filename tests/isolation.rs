//! Every channel on its own: a push service, or an application endpoint, that holds every
//! request unanswered until the test releases it takes nothing the email lane needs. With
//! `redis.pool_size` at its minimum and each channel's default concurrency, every email
//! delivery is settled while the other channel's requests are still held; released, the
//! held channel settles too. No timing in what is asserted: the far end answers only when
//! told to.

mod common;

use std::time::Duration;

use common::{CAMPAIGN, PERIOD, World, eventually};
use mailstream::audience::subscribers::push::{self as subscriptions, Subscription};
use mailstream::config::{AppChannelConfig, Config, PushChannelConfig, Secret};
use mailstream::model::webpush::VapidKey;
use mailstream::model::work::Channel;
use mailstream::store::{Counts, Store};
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::tools::emulator::app::AppEndpoint;
use mailstream::tools::emulator::hold::Holds;
use mailstream::tools::emulator::push::PushService;

const SETTLE: Duration = Duration::from_secs(120);
const SUBSCRIBERS: usize = 60;

/// The smallest pool the config takes (more than two connections per partition and
/// four), and a lease long enough for a request that waits a minute.
fn smallest_pool(c: &mut Config) {
    c.redis.pool_size = 2 * usize::from(c.redis.partitions) + 5;
    c.delivery.lease_seconds = 62;
}

async fn settled(store: &Store, channel: Channel) -> Option<Counts> {
    let c = store.channel_counts(CAMPAIGN, &PERIOD, channel).await.ok()?;
    (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
}

/// Kicks, runs a daemon, and checks that every email is settled `sent` while `holds`
/// keeps the other channel's requests waiting; then releases them and waits for
/// `channel` to settle.
async fn email_goes_while(world: &mut World, holds: &Holds, channel: Channel) -> Counts {
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    holds.hold_all();
    world.kick().await;
    let daemon = world.daemon();
    assert!(holds.wait_for(1, SETTLE).await, "a request of the {channel:?} channel reached its far end");
    let store = world.store.clone();
    let email = eventually(SETTLE, || settled(&store, Channel::Email)).await;
    // Checked before the release: nothing the held requests had kept email from going.
    let still_held = holds.waiting();
    let other = world.store.channel_counts(CAMPAIGN, &PERIOD, channel).await.unwrap();
    holds.release();
    let email = email.expect("every email settled while the other channel's requests were held");
    assert_eq!(email.sent as usize, SUBSCRIBERS, "{email:?}");
    assert_eq!(emulator.accepted().len(), SUBSCRIBERS);
    assert!(still_held > 0, "the far end still held requests when the email was done");
    assert!(other.settled() < other.enqueued, "{channel:?} was still held: {other:?}");
    let done = eventually(SETTLE, || settled(&store, channel)).await;
    daemon.stop().await;
    done.unwrap_or_else(|| panic!("{channel:?} settled once released"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_service_that_never_answers_takes_nothing_from_email() {
    let service = PushService::new();
    let (_, _stop_push, _) = service.spawn_local().await.unwrap();
    let (private, vapid) = VapidKey::generate();
    let mut world = World::with(Default::default(), |c| {
        c.campaigns[0].channels = vec![Channel::Email, Channel::Push];
        smallest_pool(c);
        // The shipped concurrency (32), the shipped timeout: a held request waits on.
        c.channels.push = Some(PushChannelConfig {
            allowed_hosts: Some(vec![service.allowed_host()]),
            timeout_ms: 60_000,
            ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(private))
        });
    })
    .await;
    assert!(world.config.redis.pool_size < world.config.channels.push.as_ref().unwrap().concurrency);
    let subs = world.subscribers(SUBSCRIBERS).await;
    let browsers: Vec<(String, Subscription)> = subs
        .iter()
        .map(|s| (s.id.clone(), Subscription::from_value(service.subscribe(&vapid.public)).unwrap()))
        .collect();
    subscriptions::add_many(&world.store, &browsers).await.unwrap();
    let push = email_goes_while(&mut world, &service.holds, Channel::Push).await;
    assert_eq!(push.sent as usize, SUBSCRIBERS, "{push:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_never_answers_takes_nothing_from_email() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let endpoint = AppEndpoint::new(secret).unwrap();
    let (url, _stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = World::with(Default::default(), |c| {
        c.campaigns[0].channels = vec![Channel::Email, Channel::App];
        smallest_pool(c);
        let shipped: AppChannelConfig = toml::from_str(&format!("url = \"{url}\"")).unwrap();
        c.channels.app = Some(AppChannelConfig { timeout_ms: 60_000, secret: Some(Secret::new(secret)), ..shipped });
    })
    .await;
    assert!(world.config.redis.pool_size < world.config.channels.app.as_ref().unwrap().concurrency);
    world.subscribers(SUBSCRIBERS).await;
    let app = email_goes_while(&mut world, &endpoint.holds, Channel::App).await;
    assert_eq!(app.sent as usize, SUBSCRIBERS, "{app:?}");
    assert_eq!(endpoint.stats().duplicates, 0);
}
