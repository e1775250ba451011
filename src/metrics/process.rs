//! The standard `process_*` metrics (CPU, memory, file descriptors, start time),
//! read from `/proc/self` at each scrape, as Prometheus's own clients export them.
//! On a system without `/proc` they are simply absent.

use prometheus::core::{Collector as PromCollector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

/// Reads `/proc/self` when gathered.
pub(crate) struct Collector {
    descs: Vec<Desc>,
}

const FAMILIES: [(&str, &str, MetricType); 6] = [
    ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds", MetricType::COUNTER),
    ("process_resident_memory_bytes", "Resident memory size in bytes", MetricType::GAUGE),
    ("process_virtual_memory_bytes", "Virtual memory size in bytes", MetricType::GAUGE),
    ("process_open_fds", "Number of open file descriptors", MetricType::GAUGE),
    ("process_max_fds", "Maximum number of open file descriptors", MetricType::GAUGE),
    ("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds", MetricType::GAUGE),
];

impl Collector {
    pub fn new() -> Collector {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, _)| Desc::new(name.to_string(), help.to_string(), vec![], Default::default()))
            .collect::<Result<_, _>>()
            .expect("valid descriptions");
        Collector { descs }
    }
}

impl PromCollector for Collector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(values) = read() else { return Vec::new() };
        FAMILIES.iter().zip(values).map(|((name, help, kind), value)| family(name, help, *kind, value)).collect()
    }
}

fn family(name: &str, help: &str, kind: MetricType, value: f64) -> MetricFamily {
    let mut m = proto::Metric::default();
    if kind == MetricType::COUNTER {
        let mut c = proto::Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = proto::Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(vec![m]);
    f
}

/// The six values, in `FAMILIES` order.
fn read() -> Option<[f64; 6]> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces), from field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf reads a system constant and has no preconditions.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (ticks, page) = (ticks.max(1) as f64, page.max(1) as f64);
    let cpu = (field(14)? + field(15)?) / ticks;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok()))?;
    let start = boot + field(22)? / ticks;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::INFINITY);
    Some([cpu, field(24)? * page, field(23)?, open_fds, max_fds, start])
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_reads_sensibly() {
        let [cpu, rss, virt, fds, max_fds, start] = super::read().expect("/proc/self is readable on Linux");
        assert!(cpu >= 0.0 && rss > 0.0 && virt >= rss && fds >= 1.0 && max_fds >= fds, "{cpu} {rss} {virt} {fds}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(start > 1.0e9 && start <= now + 1.0, "{start} vs {now}");
    }
}
