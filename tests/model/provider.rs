//! The provider the walks' requests reach: plain HTTP/1.1 over loopback, answering each
//! `POST /emails/batch` as the model chose (the walk sets the reply before the request),
//! so the daemon's own client reads a real answer, a dropped connection or no answer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the provider does with the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// 200 with an id per email.
    Accept,
    /// Reads the request, then drops the connection with no answer (processed or not,
    /// nobody can tell).
    Close,
    /// Reads the request and never answers: the client's timeout ends it.
    Hang,
    /// 429 `rate_limit_exceeded`, `retry-after: 1`.
    RateLimited,
    /// 403 `validation_error`: the sender's domain is not verified.
    SenderRefused,
    /// 409 `invalid_idempotent_request`: the key was used with another body.
    KeyReused,
}

/// A running stand-in; it stops with the runtime.
pub struct Provider {
    pub url: String,
    reply: Arc<Mutex<Reply>>,
}

impl Provider {
    pub async fn start() -> anyhow::Result<Provider> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let reply = Arc::new(Mutex::new(Reply::Accept));
        let shared = reply.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Provider { url, reply })
    }

    /// The reply to the next request.
    pub fn set(&self, reply: Reply) {
        *self.reply.lock().expect("the reply") = reply;
    }
}

/// One connection: requests answered in turn until the client closes it.
async fn serve(mut stream: TcpStream, reply: Arc<Mutex<Reply>>) {
    let mut buffer = Vec::new();
    loop {
        let Some(body) = read_request(&mut stream, &mut buffer).await else { return };
        let now = *reply.lock().expect("the reply");
        let (status, json, extra) = match now {
            Reply::Close => return,
            Reply::Hang => {
                // Until the client gives up and closes (bounded: the walk never waits so long).
                let mut byte = [0u8; 1];
                let _ = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut byte)).await;
                return;
            }
            Reply::Accept => {
                let emails = serde_json::from_slice::<Vec<serde_json::Value>>(&body).map_or(0, |v| v.len());
                let ids: Vec<String> = (0..emails).map(|i| format!(r#"{{"id":"re_walk_{i}"}}"#)).collect();
                ("200 OK", format!(r#"{{"data":[{}]}}"#, ids.join(",")), "")
            }
            Reply::RateLimited => (
                "429 Too Many Requests",
                r#"{"statusCode":429,"name":"rate_limit_exceeded","message":"Too many requests."}"#.to_string(),
                "retry-after: 1\r\n",
            ),
            Reply::SenderRefused => (
                "403 Forbidden",
                r#"{"statusCode":403,"name":"validation_error","message":"The acme.example domain is not verified. Please, add and verify your domain."}"#.to_string(),
                "",
            ),
            Reply::KeyReused => (
                "409 Conflict",
                r#"{"statusCode":409,"name":"invalid_idempotent_request","message":"Same idempotency key used with a different request payload."}"#.to_string(),
                "",
            ),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
            json.len()
        );
        if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(json.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads one request (its head, then a body of `content-length` bytes); `None` when the
/// connection closes first.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("the client sends a content-length");
    while buffer.len() < end + length {
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[end..end + length].to_vec();
    buffer.drain(..end + length);
    Some(body)
}
