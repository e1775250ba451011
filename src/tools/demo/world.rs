//! What a demo runs on: the embedded config pointed at a private Redis (or the one
//! given, under a fresh prefix), the Resend emulator posting signed webhooks back to the
//! daemon's public listener, and the far ends of the other channels.

use anyhow::Context;

use super::{DemoOptions, channels};
use crate::config::{Config, Secret};
use crate::shutdown;
use crate::store::redis_server::{RedisOptions, RedisServer};
use crate::tools::emulator::{Emulator, EmulatorConfig};

/// What a demo runs on: the embedded config pointed at a private Redis (or the one
/// given, under a fresh prefix), the emulator (which posts signed webhooks back to the
/// daemon's public listener), and the other channels' far ends.
pub(super) struct World {
    pub(super) config: Config,
    pub(super) campaign: crate::config::CampaignConfig,
    pub(super) channels: Vec<crate::model::work::Channel>,
    /// Kept until the end of the run: dropping it stops the private Redis.
    pub(super) _private_redis: Option<RedisServer>,
    /// The daemon's public listener, until the daemon takes it.
    pub(super) public: Option<tokio::net::TcpListener>,
    pub(super) emulator: Emulator,
    pub(super) emulator_url: String,
    pub(super) stop_emulator: shutdown::Trigger,
    pub(super) emulator_task: tokio::task::JoinHandle<()>,
    pub(super) ends: channels::Ends,
}

impl World {
    pub(super) async fn new(opts: &DemoOptions) -> anyhow::Result<World> {
        let mut config = Config::example();
        config.campaigns.iter_mut().for_each(|c| c.schedule = None);
        let mut private_redis = None;
        match &opts.redis_url {
            Some(url) => {
                config.redis.url = Secret::new(url.clone());
                config.redis.prefix = format!("mailstream-demo-{}", crate::model::id::new_id().to_ascii_lowercase());
                // Someone else's Redis, for a demo: run on it whatever its persistence.
                config.redis.durability = crate::config::Durability::Relaxed;
            }
            None => {
                // Durable as production should be: append-only, fsync on every write.
                let server = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
                config.redis.url = Secret::new(server.url());
                private_redis = Some(server);
            }
        }

        // The daemon's public listener, and the secret its webhooks are signed with: the
        // emulator posts signed events about what it accepted back to the daemon.
        let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the public listener")?;
        let public_url = format!("http://{}", public.local_addr()?);
        let webhook_secret = format!(
            "whsec_{}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, rand::random::<[u8; 24]>())
        );
        config.webhook.secrets = vec![Secret::new(webhook_secret.clone())];
        config.unsubscribe.secrets = vec![Secret::new(crate::model::id::new_id())];
        config.unsubscribe.base_url = public_url.clone();
        // One source (the emulator) sends every webhook here: no per-source cap to speak of.
        config.http.public_requests_per_second_per_source = 1_000_000;
        let webhook = crate::tools::emulator::WebhookTarget {
            url: format!("{public_url}/webhooks/resend"),
            secret: webhook_secret,
        };
        let emulator = Emulator::new(EmulatorConfig {
            requests_per_second: Some(opts.rps),
            webhook: Some(webhook),
            ..Default::default()
        });
        let (emulator_url, stop_emulator, emulator_task) =
            emulator.spawn_local().await.context("starting the emulator")?;

        config.resend.base_url = emulator_url.clone();
        config.resend.api_key = Some(Secret::new("re_demo_key"));
        config.resend.requests_per_second = opts.rps;
        config.http.metrics_listen = None;
        let channels = opts.channels.clone().unwrap_or_else(|| vec![crate::model::work::Channel::Email]);
        let ends = channels::configure(&mut config, &opts.campaign, &channels).await?;
        config.validate()?;
        let campaign = config
            .campaign(&opts.campaign)
            .with_context(|| format!("no campaign {:?} in the embedded config", opts.campaign))?
            .clone();
        Ok(World {
            config,
            campaign,
            channels,
            _private_redis: private_redis,
            public: Some(public),
            emulator,
            emulator_url,
            stop_emulator,
            emulator_task,
            ends,
        })
    }

    /// The most emails per second the emulated provider takes.
    pub(super) fn ceiling(&self) -> f64 {
        f64::from(self.config.resend.requests_per_second) * self.config.resend.batch_size as f64
    }
}
