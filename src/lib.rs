//! mailstream delivers scheduled and transactional email through Resend,
//! exactly once in effect, as fast as the provider allows, on Redis Streams.
//! [`run`] is the daemon (`daemon.rs`); `main.rs` only calls [`cli::main`]. This file
//! is the table of contents: one folder per concept, bottom to top.

pub mod audience;
pub mod channels;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod http;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod resend;
pub mod send;
pub mod shutdown;
pub mod store;
pub mod tools;

pub use crate::daemon::{Listeners, RunOptions, run, run_with};
pub use crate::send::ctx::{Failpoints, Hold};
