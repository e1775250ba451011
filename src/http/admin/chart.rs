//! The overview's chart of the last hour: deliveries settled per minute (sent, skipped,
//! outcome unknown, failed, stacked), drawn on the server as an inline SVG from the
//! partitions' per-minute counters, so the page needs no script and no front-end build.
//! Only numbers and fixed words reach it.

use std::fmt::Write;

use crate::store::Minute;

/// The chart's drawing box (the SVG scales to its container's width).
const WIDTH: u64 = 600;
const HEIGHT: u64 = 120;

/// The states stacked in each minute's bar, bottom first, with their colours.
const LAYERS: [(&str, &str); 4] =
    [("sent", "#2e7d32"), ("skipped", "#9e9e9e"), ("outcome unknown", "#ef6c00"), ("failed", "#c62828")];

fn layers(m: &Minute) -> [u64; 4] {
    [m.sent, m.skipped, m.outcome_unknown, m.failed]
}

/// The settled deliveries of `minutes` (oldest first, one per minute) as an SVG: one bar a
/// minute, its height scaled to the busiest minute, each with a title saying its figures.
pub(crate) fn svg(minutes: &[Minute]) -> String {
    let peak = minutes.iter().map(|m| layers(m).iter().sum::<u64>()).max().unwrap_or(0);
    let most = peak.max(1);
    let total: [u64; 4] = minutes.iter().fold([0; 4], |mut t, m| {
        t.iter_mut().zip(layers(m)).for_each(|(t, n)| *t += n);
        t
    });
    let mut out = String::new();
    let summary: Vec<String> = LAYERS.iter().zip(total).map(|((name, _), n)| format!("{n} {name}")).collect();
    let _ = write!(
        out,
        r#"<svg id="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" width="100%" role="img" aria-label="Settled in the last {len} minutes: {s}">"#,
        h = HEIGHT + 16,
        len = minutes.len(),
        s = summary.join(", ")
    );
    let step = WIDTH as f64 / minutes.len().max(1) as f64;
    for (i, m) in minutes.iter().enumerate() {
        let x = i as f64 * step;
        let at = chrono::DateTime::from_timestamp(m.minute * 60, 0).map(|t| t.format("%H:%M UTC").to_string());
        let figures: Vec<String> =
            LAYERS.iter().zip(layers(m)).filter(|(_, n)| *n > 0).map(|((name, _), n)| format!("{n} {name}")).collect();
        let said = if figures.is_empty() { "nothing settled".to_string() } else { figures.join(", ") };
        let _ = write!(out, r#"<g class="minute"><title>{}: {said}</title>"#, at.unwrap_or_default());
        let mut y = HEIGHT as f64;
        for ((_, colour), n) in LAYERS.iter().zip(layers(m)) {
            if n == 0 {
                continue;
            }
            let h = n as f64 * HEIGHT as f64 / most as f64;
            y -= h;
            let _ = write!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{colour}"/>"#,
                w = (step - 1.0).max(1.0)
            );
        }
        out.push_str("</g>");
    }
    let _ = write!(
        out,
        r##"<line x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}" stroke="#555"/><text x="0" y="{b}" font-size="11">{len} min ago</text><text x="{WIDTH}" y="{b}" font-size="11" text-anchor="end">now</text><text x="2" y="11" font-size="11">{peak} a minute at most</text></svg>"##,
        b = HEIGHT + 14,
        len = minutes.len(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_minute_is_a_bar_scaled_to_the_busiest() {
        let mut minutes: Vec<Minute> =
            (0..60).map(|i| Minute { minute: 29_000_000 + i, ..Minute::default() }).collect();
        minutes[10].sent = 50;
        minutes[59] = Minute { minute: minutes[59].minute, sent: 80, failed: 20, ..Minute::default() };
        let svg = svg(&minutes);
        assert_eq!(svg.matches("<g class=\"minute\">").count(), 60);
        // The busiest minute (100) fills the height: its failed layer on top of its sent.
        assert!(svg.contains(r##"height="96.0" fill="#2e7d32""##), "{svg}");
        assert!(svg.contains(r##"y="0.0" width="9.0" height="24.0" fill="#c62828""##), "{svg}");
        assert!(svg.contains(" UTC: 80 sent, 20 failed</title>"), "{svg}");
        assert!(svg.contains("130 sent, 0 skipped, 0 outcome unknown, 20 failed"), "{svg}");
        assert!(svg.contains("100 a minute at most"));
        assert_eq!(svg.matches("nothing settled").count(), 58);
    }

    #[test]
    fn an_idle_hour_draws_no_bar_and_no_division_by_zero() {
        let minutes: Vec<Minute> = (0..60).map(|i| Minute { minute: i, ..Minute::default() }).collect();
        let svg = svg(&minutes);
        assert!(!svg.contains("<rect"));
        assert!(svg.contains("0 a minute at most"));
    }
}
