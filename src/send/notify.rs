//! systemd's notify protocol, for `Type=notify` units: READY=1 once Redis answered,
//! the scripts are loaded and the listeners are bound; STATUS= lines with the
//! backlog (what `systemctl status` shows); WATCHDOG=1 from the reclaimer's loop,
//! the loop that stops if the daemon hangs; STOPPING=1 when the drain begins.
//! Without `$NOTIFY_SOCKET` (not under systemd) every call does nothing.

use sd_notify::NotifyState;

/// Sends state changes to the service manager, if there is one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Notifier {
    /// systemd asked for watchdog pings (`$WATCHDOG_USEC`).
    watchdog: bool,
}

impl Notifier {
    /// What the environment systemd set up asks for.
    pub(crate) fn from_env() -> Notifier {
        Notifier { watchdog: sd_notify::watchdog_enabled().is_some() }
    }

    pub fn ready(&self, status: &str) {
        send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    pub fn status(&self, status: &str) {
        send(&[NotifyState::Status(status)]);
    }

    /// The loop that would stop if the daemon hung went round once more.
    pub fn alive(&self) {
        if self.watchdog {
            send(&[NotifyState::Watchdog]);
        }
    }

    pub fn stopping(&self) {
        send(&[NotifyState::Stopping, NotifyState::Status("stopping: handing back claimed work")]);
    }
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "could not notify the service manager");
    }
}
