//! What an operator reads and runs: the delivery log, dead letters, the SLO and its mail,
//! logs, and the scheduler that fires campaigns and the report.

pub mod dead_letters;
pub mod deliveries;
pub mod logging;
pub mod schedule;
pub mod slo;
pub mod slo_mail;
pub mod suppression_sync;
