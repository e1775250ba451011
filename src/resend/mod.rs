//! Talking to Resend: the client, the classification of its errors, and the
//! local emulator that stands in for it in the demo, the tests and benchmarks.

pub mod client;
pub mod emulator;
pub mod error;

pub use client::{BatchAccepted, Client, ItemResult, RateHeaders};
pub use error::{Action, ProviderError};
