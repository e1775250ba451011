//! What a developer or a test runs beside the daemon: the Resend emulator and the demo.

pub mod demo;
pub mod emulator;
