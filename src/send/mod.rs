//! The exactly-once email core, one file per step of the flow, in its order:
//! `read` (partition readers: XREADGROUP, claim) → `resolve` (at send time, and render) →
//! `queue` (per lane and partition, waiting for a request slot) → `dispatch` (request
//! slots) → `seal` → `gate` → `request` (one POST, and what follows it) →
//! `fallback` (operator mail, once) → `settle`; beside them `release` (claimed work
//! given back), `reclaim` (what a dead holder left), `limiter`, `retry`, `pause`,
//! `stuck`, `ctx` (what every task shares), and `steps` (the path one step at a time,
//! for the protocol model's conformance walks).
//!
//! Words used throughout:
//! - **slot**: the moment a request may leave, team-wide (`limiter`).
//! - **lease**: a holder's claim on a delivery or a batch, until an expiry it renews.
//! - **hold**: a batch in this instance's hands, its lease renewed, left alone by the reclaimer.
//! - **gate**: the last look, in one script call, right before the slot (`gate`).
//! - **take**: a taker's claim on a batch another holder left (take.lua, `reclaim`).
//! - **sealed**: a batch whose exact body and Idempotency-Key are stored (`seal`).
//! - **maybe-sent**: a request of it may have reached the provider; never resent past the window.
//! - **settle**: each member's outcome recorded, the batch deleted (`settle`).

pub mod read;

pub mod resolve;

pub mod queue;

pub mod partition_gate;

pub mod release;

pub mod dispatch;

pub mod seal;

pub mod gate;

pub mod request;

pub mod fallback;

pub mod settle;

pub mod reclaim;

pub mod limiter;

pub mod retry;

pub mod pause;

pub mod stuck;

pub mod ctx;

pub mod notify;

/// The send path one step at a time, for the protocol model's conformance walks.
pub mod steps;
