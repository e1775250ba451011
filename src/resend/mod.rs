//! Talking to Resend: the client and the classification of its errors. (The
//! local stand-in for Resend is the `emulator` module.)

pub mod client;
pub mod error;
pub mod suppressions;

pub use client::{AcceptedEmail, BatchAccepted, Client, RateHeaders};
pub use error::{Action, ProviderError};
pub use suppressions::{ListedSuppression, SuppressionPage};
