//! Who gets what: the subscriber registry, the kick that fans a campaign period out over
//! it, transactional items, suppressions, and what each email says (templates, the render
//! hook, unsubscribe tokens).

pub mod ingest;
pub mod kick;
pub mod render;
pub mod render_hook;
pub mod subscribers;
pub mod suppression;
pub mod tokens;
