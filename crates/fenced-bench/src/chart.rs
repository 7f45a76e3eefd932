//! The benchmark's figures as one SVG file: throughput by client count per
//! system (S2), and latency percentiles (p50, p99, p999) per system and
//! scenario on a log scale.
//!
//! Plain SVG written here rather than a plotting crate: two simple panels,
//! no fonts to load or measure (text is left to the viewer), no dependency.

use std::fmt::Write;

/// One system's throughput: (clients, operations per second), by clients.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub system: String,
    pub points: Vec<(usize, f64)>,
}

/// One system's latency in one scenario, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyRow {
    pub scenario: String,
    pub system: String,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

/// What the chart shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChartData {
    /// Says what was run (durations, rounds, build).
    pub title: String,
    pub throughput: Vec<Series>,
    pub latency: Vec<LatencyRow>,
}

const WIDTH: f64 = 900.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 170.0;
const THROUGHPUT_HEIGHT: f64 = 260.0;
const ROW: f64 = 18.0;
const LATENCY_LABELS: f64 = 220.0;

/// A colour per system, the same in both panels.
fn colour(system: &str) -> &'static str {
    match system {
        "fenced" => "#1f77b4",
        "etcd" => "#d62728",
        "postgres" => "#2ca02c",
        _ => "#7f7f7f",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step for about `ticks` ticks up to `max`.
fn step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn number(v: f64) -> String {
    if !v.is_finite() {
        "–".to_string()
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The whole file.
pub fn render(data: &ChartData) -> String {
    let latency_rows = data.latency.len() as f64;
    let latency_top = 60.0 + THROUGHPUT_HEIGHT + 90.0;
    let height = latency_top + 30.0 + latency_rows.max(1.0) * ROW + 50.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        out,
        "<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        escape(&data.title)
    );
    throughput(&mut out, &data.throughput, 60.0);
    latency(&mut out, &data.latency, latency_top);
    out.push_str("</svg>\n");
    out
}

fn throughput(out: &mut String, series: &[Series], top: f64) {
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">\
         Throughput by client count (S2, uncontended; acquire+release cycles/s)</text>",
        top - 12.0
    );
    let (x0, x1) = (LEFT, WIDTH - RIGHT);
    let (y0, y1) = (top + THROUGHPUT_HEIGHT, top);
    let mut clients: Vec<usize> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    clients.sort_unstable();
    clients.dedup();
    if clients.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{x0}\" y=\"{}\">not measured (run scenario s2)</text>",
            top + 20.0
        );
        return;
    }
    // Client counts on a log scale, so 1, 16, 64 and 256 spread out.
    let (lo, hi) = (
        (clients[0].max(1) as f64).log2(),
        (clients[clients.len() - 1].max(1) as f64).log2(),
    );
    let x = |c: usize| {
        if hi > lo {
            x0 + ((c.max(1) as f64).log2() - lo) / (hi - lo) * (x1 - x0)
        } else {
            (x0 + x1) / 2.0
        }
    };
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let step = step(max.max(1.0), 5.0);
    let top_value = (max / step).ceil().max(1.0) * step;
    let y = |v: f64| y0 - v / top_value * (y0 - y1);
    let mut v = 0.0;
    while v <= top_value + step / 2.0 {
        let _ = writeln!(
            out,
            "<line x1=\"{x0}\" y1=\"{yy:.1}\" x2=\"{x1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            x0 - 6.0,
            y(v) + 4.0,
            number(v),
            yy = y(v),
        );
        v += step;
    }
    for c in &clients {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{c}</text>",
            x(*c),
            y0 + 18.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">clients</text>",
        (x0 + x1) / 2.0,
        y0 + 36.0
    );
    for (i, s) in series.iter().enumerate() {
        let c = colour(&s.system);
        let points: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        let _ = writeln!(
            out,
            "<g class=\"series\" data-system=\"{}\"><polyline fill=\"none\" stroke=\"{c}\" \
             stroke-width=\"2\" points=\"{}\"/>",
            escape(&s.system),
            points.join(" ")
        );
        for p in s.points.iter().filter(|p| p.1.is_finite()) {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{c}\"><title>{} with {} clients: {} cycles/s</title></circle>",
                x(p.0),
                y(p.1),
                escape(&s.system),
                p.0,
                number(p.1)
            );
        }
        out.push_str("</g>\n");
        let ly = y1 + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            out,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{c}\" stroke-width=\"3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x1 + 20.0,
            x1 + 44.0,
            x1 + 50.0,
            ly + 4.0,
            escape(&s.system)
        );
    }
}

fn latency(out: &mut String, rows: &[LatencyRow], top: f64) {
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">\
         Latency percentiles, ms, log scale (○ p50, □ p99, ◇ p999)</text>",
        top - 12.0
    );
    let values: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.p50, r.p99, r.p999])
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if values.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{LEFT}\" y=\"{}\">not measured</text>",
            top + 20.0
        );
        return;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(0.0, f64::max);
    let (d0, d1) = (
        lo.log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let (x0, x1) = (LATENCY_LABELS, WIDTH - RIGHT);
    // Only positive, finite values reach here (markers and decade ticks).
    let x = |v: f64| x0 + (v.log10() - d0) / (d1 - d0) * (x1 - x0);
    let (y_top, y_bottom) = (top + 10.0, top + 10.0 + rows.len() as f64 * ROW);
    let mut d = d0;
    while d <= d1 {
        let v = 10f64.powf(d);
        let _ = writeln!(
            out,
            "<line class=\"decade\" x1=\"{xx:.1}\" y1=\"{y_top:.1}\" x2=\"{xx:.1}\" y2=\"{y_bottom:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            y_bottom + 16.0,
            number(v),
            xx = x(v),
        );
        d += 1.0;
    }
    for (i, r) in rows.iter().enumerate() {
        let c = colour(&r.system);
        let cy = y_top + (i as f64 + 0.5) * ROW;
        let label = format!("{} · {}", r.scenario, r.system);
        let _ = writeln!(
            out,
            "<g class=\"latency\" data-system=\"{}\"><title>{}: p50 {} / p99 {} / p999 {} ms</title>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            escape(&r.system),
            escape(&label),
            number(r.p50),
            number(r.p99),
            number(r.p999),
            x0 - 8.0,
            cy + 4.0,
            escape(&label)
        );
        let finite: Vec<f64> = [r.p50, r.p999]
            .into_iter()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect();
        if let [a, b] = finite[..] {
            let _ = writeln!(
                out,
                "<line x1=\"{:.1}\" y1=\"{cy:.1}\" x2=\"{:.1}\" y2=\"{cy:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>",
                x(a),
                x(b)
            );
        }
        if r.p50.is_finite() && r.p50 > 0.0 {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{cy:.1}\" r=\"4\" fill=\"white\" stroke=\"{c}\" stroke-width=\"2\"/>",
                x(r.p50)
            );
        }
        if r.p99.is_finite() && r.p99 > 0.0 {
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"8\" height=\"8\" fill=\"{c}\"/>",
                x(r.p99) - 4.0,
                cy - 4.0
            );
        }
        if r.p999.is_finite() && r.p999 > 0.0 {
            let (px, py) = (x(r.p999), cy);
            let _ = writeln!(
                out,
                "<polygon points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" fill=\"{c}\"/>",
                px,
                py - 5.0,
                px + 5.0,
                py,
                px,
                py + 5.0,
                px - 5.0,
                py
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#555\">{} / {} / {}</text></g>",
            x1 + 12.0,
            cy + 4.0,
            number(r.p50),
            number(r.p99),
            number(r.p999)
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> ChartData {
        let series = |system: &str, scale: f64| Series {
            system: system.into(),
            points: vec![
                (1, 500.0 * scale),
                (16, 4_000.0 * scale),
                (64, 9_000.0 * scale),
            ],
        };
        let row = |scenario: &str, system: &str| LatencyRow {
            scenario: scenario.into(),
            system: system.into(),
            p50: 0.4,
            p99: 2.5,
            p999: 31.0,
        };
        ChartData {
            title: "fenced-bench <test> & more".into(),
            throughput: vec![
                series("fenced", 3.0),
                series("etcd", 1.0),
                series("postgres", 0.5),
            ],
            latency: vec![
                row("S1 1 client", "fenced"),
                row("S1 1 client", "etcd"),
                row("S2 64 clients", "postgres"),
                LatencyRow {
                    p999: f64::NAN,
                    ..row("S3 16 clients", "fenced")
                },
            ],
        }
    }

    #[test]
    fn the_svg_is_well_formed_and_has_every_systems_series() {
        let svg = render(&sample());
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        for system in ["fenced", "etcd", "postgres"] {
            let groups: Vec<_> = doc
                .descendants()
                .filter(|n| n.attribute("data-system") == Some(system))
                .collect();
            let lines = groups
                .iter()
                .filter(|g| g.attribute("class") == Some("series"))
                .count();
            assert_eq!(lines, 1, "one throughput line for {system}");
            let points = groups
                .iter()
                .find(|g| g.attribute("class") == Some("series"))
                .and_then(|g| g.children().find(|c| c.has_tag_name("polyline")))
                .and_then(|p| p.attribute("points"))
                .unwrap();
            assert_eq!(points.split(' ').count(), 3, "{system}: {points}");
            assert!(
                groups
                    .iter()
                    .any(|g| g.attribute("class") == Some("latency")),
                "latency markers for {system}"
            );
        }
        // The title's text came through escaped and reads back whole.
        assert!(doc
            .descendants()
            .any(|n| n.text() == Some("fenced-bench <test> & more")));
        // A missing percentile draws no marker and no NaN coordinate.
        assert!(!svg.contains("NaN"), "{svg}");
    }

    #[test]
    fn decade_lines_span_the_latency_axis_evenly() {
        let svg = render(&sample());
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let xs: Vec<f64> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("decade"))
            .map(|n| n.attribute("x1").unwrap().parse().unwrap())
            .collect();
        // 0.4 … 31 ms: 0.1, 1, 10 and 100 ms, from the labels' edge to the
        // figures' column, equally spaced.
        assert_eq!(xs.len(), 4, "{xs:?}");
        assert_eq!(xs[0], LATENCY_LABELS);
        assert_eq!(xs[3], WIDTH - RIGHT);
        let gap = xs[1] - xs[0];
        assert!(
            xs.windows(2).all(|w| (w[1] - w[0] - gap).abs() < 0.2),
            "{xs:?}"
        );
    }

    #[test]
    fn an_empty_run_still_renders_a_valid_file() {
        let svg = render(&ChartData::default());
        roxmltree::Document::parse(&svg).unwrap();
        assert!(svg.contains("not measured"));
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(step(9_000.0, 5.0), 2_000.0);
        assert_eq!(step(27_000.0, 5.0), 10_000.0);
        assert_eq!(step(4.0, 5.0), 1.0);
    }
}
