//! Logs: one JSON object per line (`log.format = "json"`, or `auto` when stderr is
//! not a terminal: journald, containers) or lines for people. Field names are
//! stable (`timestamp`, `level`, `message`, then the fields of the spans the event
//! is in, outermost first — `partition`, `lane`, `batch` — then the event's own:
//! `delivery`, `campaign`, `error`, ...); no field ever holds an address
//! (invariant 5). `MAILSTREAM_LOG` overrides `log.level`.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogConfig, LogFormat};

/// The environment variable that overrides `log.level`.
const ENV_LOG: &str = "MAILSTREAM_LOG";

/// Installs the process's logger, writing to `writer`; `terminal` tells whether it
/// is one (for `auto`). Fails if a logger is already installed.
pub fn init<W>(log: &LogConfig, writer: W, terminal: bool) -> anyhow::Result<()>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env(ENV_LOG).or_else(|_| EnvFilter::try_new(&log.level))?;
    let json = match log.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !terminal,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_target(false);
    let installed = if json {
        builder.fmt_fields(JsonFields::new()).event_format(FlatJson).try_init()
    } else {
        builder.with_ansi(terminal).try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

/// One flat JSON object per event: the spans' fields beside the event's, so a line
/// carries the batch and partition it belongs to without each call naming them.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = Map::new();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        line.insert("timestamp".into(), Value::String(now));
        line.insert("level".into(), Value::String(event.metadata().level().to_string()));
        for span in ctx.event_scope().into_iter().flat_map(|scope| scope.from_root()) {
            let extensions = span.extensions();
            // JsonFields stores a span's fields as one JSON object.
            let fields = extensions.get::<FormattedFields<N>>().and_then(|f| serde_json::from_str(f).ok());
            if let Some(Value::Object(fields)) = fields {
                line.extend(fields);
            }
        }
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields into the line (`message` among them).
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::String(value.into()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::Instrument;
    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    #[test]
    fn a_line_carries_its_spans_fields_flat_beside_its_own() {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let reader = tracing::info_span!("reader", partition = 3u16, lane = "digest");
            let _in = reader.enter();
            let batch = tracing::info_span!("batch", batch = "01BATCH");
            block_on(async { tracing::warn!(deliveries = 7u64, "a thing happened") }.instrument(batch));
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "a thing happened");
        assert_eq!(line["partition"], 3);
        assert_eq!(line["lane"], "digest");
        assert_eq!(line["batch"], "01BATCH");
        assert_eq!(line["deliveries"], 7);
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
    }

    /// Polls a future that never waits to its end.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }
}
