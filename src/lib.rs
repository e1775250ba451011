//! mailstream delivers scheduled and transactional email through Resend,
//! exactly once in effect, as fast as the provider allows, on Redis Streams.
//! [`run`] is the daemon (`daemon.rs`); `main.rs` only parses arguments and wires
//! signals. This file is the table of contents: one module per room.

pub mod admin;
pub mod app;
pub mod attempt;
pub mod batch;
pub mod batcher;
pub mod channel;
pub mod claims;
pub mod cli;
pub mod config;
pub mod consumer;
pub mod ctx;
pub mod daemon;
pub mod db;
pub mod dead_letters;
pub mod deliveries;
pub mod demo;
pub mod dispatch;
pub mod emulator;
pub mod hook;
pub mod http;
pub mod id;
pub mod ingest;
pub mod kick;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod notify;
pub mod outcome;
pub mod pause;
pub mod period;
pub mod private;
pub mod public;
pub mod push;
pub mod push_endpoint;
pub mod reclaim;
pub mod redis_server;
pub mod render;
pub mod report;
pub mod resend;
pub mod retry;
pub mod schedule;
pub mod shutdown;
pub mod slo;
pub mod stuck;
pub mod subscribers;
pub mod suppression;
pub mod svix;
pub mod tokens;
pub mod webpush;
pub mod work;

pub use crate::ctx::{Failpoints, Hold};
pub use crate::daemon::{Listeners, RunOptions, run, run_with};
