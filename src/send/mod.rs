//! The exactly-once email core.

pub mod batch;
pub mod ctx;
pub mod dispatch;
pub mod limiter;
pub mod notify;
pub mod pause;
pub mod queue;
pub mod read;
pub mod reclaim;
pub mod release;
pub mod request;
pub mod retry;
pub mod stuck;
