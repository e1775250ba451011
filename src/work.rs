//! The values that travel down the send path (consumer → batcher → dispatch →
//! sender): a reference to a delivery, a rendered email waiting for a batch,
//! a sealed batch, and the next request's worth of work.

use bytes::Bytes;

/// Which delivery, and the campaign period it counts towards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryRef {
    pub id: String,
    pub campaign: String,
    pub period: String,
}

/// A claimed, rendered email waiting for a batch.
#[derive(Debug, Clone)]
pub struct Ready {
    /// Its stream entry (acknowledged when the batch is sealed).
    pub entry: String,
    pub delivery: DeliveryRef,
    /// The email object, exactly as it will be sent.
    pub json: String,
}

/// A sealed batch in hand: what to send and who is in it.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub partition: u16,
    pub id: String,
    /// Its Idempotency-Key, fixed at sealing.
    pub key: String,
    /// The exact request body stored at sealing.
    pub body: Bytes,
    pub members: Vec<DeliveryRef>,
    /// Attempts that failed before this one.
    pub failed: u32,
    /// Whether an earlier attempt may have been processed by the provider.
    pub maybe_sent: bool,
}

/// The next request to make.
#[derive(Debug)]
pub enum Work {
    /// A new batch of one partition's emails, to seal and send.
    Fresh(u16, Vec<Ready>),
    /// A sealed batch to send again, same key and body.
    Resend(Sealed),
}
