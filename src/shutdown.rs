//! Two-phase shutdown. A [`Trigger`] says "begin"; every task holds a
//! [`Shutdown`] and selects on it in each loop and sleep. Completion is known
//! when the tasks have ended (the caller joins them, with a deadline).

use std::time::Duration;

use tokio::sync::watch;

/// Starts shutdown for every [`Shutdown`] made from it.
#[derive(Clone, Debug)]
pub struct Trigger(watch::Sender<bool>);

/// A task's view of the shutdown signal. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// A linked trigger and listener.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Begins shutdown (idempotent).
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    /// A new listener for this trigger.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

/// Waits until every task of `tasks` has ended (a panic in one is raised here).
pub(crate) async fn join_all(mut tasks: tokio::task::JoinSet<()>) {
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

impl Shutdown {
    /// Whether shutdown has begun.
    pub(crate) fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown has begun (or the trigger is gone).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|&down| down).await;
    }

    /// Sleeps for `d`; returns `false` if shutdown began first.
    pub async fn sleep(&mut self, d: Duration) -> bool {
        tokio::select! {
            _ = self.wait() => false,
            _ = tokio::time::sleep(d) => !self.is_triggered(),
        }
    }

    /// A listener that never fires (for tools that run to completion).
    pub fn never() -> Shutdown {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        Shutdown(rx)
    }
}

/// SIGTERM or SIGINT begins a graceful shutdown; a second one exits at once
/// (leases and sealed batches make that safe: the next instance recovers).
pub(crate) fn on_signals() -> std::io::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let (trigger, shutdown) = channel();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            seen += 1;
            if seen == 1 {
                tracing::warn!("shutting down: finishing in-flight requests (signal again to exit now)");
                trigger.trigger();
            } else {
                tracing::warn!("exiting now; unfinished work stays leased or sealed for the next instance");
                std::process::exit(130);
            }
        }
    });
    Ok(shutdown)
}
