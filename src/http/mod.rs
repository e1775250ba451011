//! The HTTP surface: a small server, the public listener (webhooks, unsubscribe, the
//! ingest API) and the private one (`/metrics`, the admin pages).

pub mod admin;
pub mod private;
pub mod public;
pub mod server;
