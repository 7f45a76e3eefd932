//! The figures: one line per measured run, the comparison table over the
//! systems and rounds, the targets, and the chart.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use fenced_bench::{
    chart::{self, ChartData, LatencyRow, Series},
    stats::Recorder,
};

use crate::{load::Run, sut::ProbeSample, systems::Kind, Args};

/// What failed the run (a budget exceeded, calls failed): printed at the
/// end, and the exit status is 1.
#[derive(Default)]
pub struct Outcome {
    pub failures: Vec<String>,
}

/// One figure of the comparison table: what each round measured.
#[derive(Debug, Clone)]
pub struct Figure {
    values: Vec<f64>,
    higher_is_better: bool,
}

impl Figure {
    /// The median of the rounds.
    pub fn value(&self) -> f64 {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
}

#[derive(Default)]
pub struct Table {
    /// row label -> system -> figure, in insertion order of labels.
    rows: Vec<(String, BTreeMap<Kind, Figure>)>,
    /// For the chart: scenario -> system -> p50, p99, p999 (ms), in
    /// insertion order of scenarios.
    percentiles: Vec<(String, BTreeMap<Kind, [Figure; 3]>)>,
}

impl Table {
    pub fn put(&mut self, label: &str, kind: Kind, value: f64, higher_is_better: bool) {
        let row = match self.rows.iter().position(|(l, _)| l == label) {
            Some(i) => &mut self.rows[i].1,
            None => {
                self.rows.push((label.to_string(), BTreeMap::new()));
                let last = self.rows.len() - 1;
                &mut self.rows[last].1
            }
        };
        row.entry(kind)
            .or_insert_with(|| Figure {
                values: Vec::new(),
                higher_is_better,
            })
            .values
            .push(value);
    }

    /// Notes `op`'s p50, p99 and p999 in `run` for the chart.
    pub fn put_percentiles(&mut self, scenario: &str, kind: Kind, run: &Run, op: &str) {
        let i = match self.percentiles.iter().position(|(s, _)| s == scenario) {
            Some(i) => i,
            None => {
                self.percentiles
                    .push((scenario.to_string(), BTreeMap::new()));
                self.percentiles.len() - 1
            }
        };
        let figures = self.percentiles[i].1.entry(kind).or_insert_with(|| {
            std::array::from_fn(|_| Figure {
                values: Vec::new(),
                higher_is_better: false,
            })
        });
        for (figure, q) in figures.iter_mut().zip([0.5, 0.99, 0.999]) {
            figure
                .values
                .push(micros_ms(run.rec.quantile_micros(op, q)));
        }
    }

    /// The chart's data: S2 throughput by client count, and every noted
    /// scenario's percentiles (medians over the rounds).
    fn chart(&self, title: String, s2_clients: &[usize]) -> ChartData {
        let mut kinds: Vec<Kind> = self
            .rows
            .iter()
            .flat_map(|(_, r)| r.keys().copied())
            .collect();
        kinds.sort();
        kinds.dedup();
        let throughput = kinds
            .iter()
            .map(|&kind| Series {
                system: kind.name().to_string(),
                points: s2_clients
                    .iter()
                    .filter_map(|&n| {
                        Some((n, self.get(&format!("S2 {n} clients: cycles/s"), kind)?))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        let latency = self
            .percentiles
            .iter()
            .flat_map(|(scenario, by_kind)| {
                by_kind.iter().map(|(kind, [p50, p99, p999])| LatencyRow {
                    scenario: scenario.clone(),
                    system: kind.name().to_string(),
                    p50: p50.value(),
                    p99: p99.value(),
                    p999: p999.value(),
                })
            })
            .collect();
        ChartData {
            title,
            throughput,
            latency,
        }
    }

    pub fn get(&self, label: &str, kind: Kind) -> Option<f64> {
        self.rows
            .iter()
            .find(|(l, _)| l == label)
            .and_then(|(_, r)| r.get(&kind))
            .map(Figure::value)
    }

    /// How many times better fenced is than `other` on a row (> 1: better).
    pub fn ratio(&self, label: &str, other: Kind) -> Option<f64> {
        let row = &self.rows.iter().find(|(l, _)| l == label)?.1;
        let f = row.get(&Kind::Fenced)?;
        let o = row.get(&other)?;
        if f.higher_is_better {
            (o.value() > 0.0).then(|| f.value() / o.value())
        } else {
            (f.value() > 0.0).then(|| o.value() / f.value())
        }
    }

    pub fn print(&self) {
        let cell = |v: Option<f64>| match v {
            Some(v) if v.is_finite() && v.abs() >= 100.0 => format!("{v:.0}"),
            Some(v) if v.is_finite() => format!("{v:.2}"),
            Some(_) => "inf".into(),
            None => "-".into(),
        };
        let ratio = |v: Option<f64>| v.map_or("-".into(), |r| format!("{r:.2}x"));
        println!();
        println!(
            "| scenario | fenced | etcd | PostgreSQL | PostgreSQL + sync standby | fenced vs etcd \
             | fenced vs PostgreSQL | fenced vs PostgreSQL + sync standby |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (label, _) in &self.rows {
            println!(
                "| {label} | {} | {} | {} | {} | {} | {} | {} |",
                cell(self.get(label, Kind::Fenced)),
                cell(self.get(label, Kind::Etcd)),
                cell(self.get(label, Kind::Postgres)),
                cell(self.get(label, Kind::PostgresSync)),
                ratio(self.ratio(label, Kind::Etcd)),
                ratio(self.ratio(label, Kind::Postgres)),
                ratio(self.ratio(label, Kind::PostgresSync)),
            );
        }
        println!("(ratios: how many times better fenced is; > 1 means fenced is faster)");
    }
}

pub fn ms(micros: Option<u64>) -> String {
    micros.map_or("-".into(), |m| format!("{:.2}", m as f64 / 1000.0))
}

pub fn quantiles(rec: &Recorder, op: &str) -> String {
    format!(
        "{} p50/p99/p999 {}/{}/{} ms",
        op,
        ms(rec.quantile_micros(op, 0.5)),
        ms(rec.quantile_micros(op, 0.99)),
        ms(rec.quantile_micros(op, 0.999)),
    )
}

/// Prints one run's figures.
pub fn report(kind: Kind, name: &str, run: &Run, before: ProbeSample, after: ProbeSample) {
    let ops = run.ops.max(1) as f64;
    let mut line = format!(
        "[{}] {name}: {:.0} ops/s ({} ops in {:.1} s), errors {}",
        kind.name(),
        run.ops_per_second(),
        run.ops,
        run.elapsed.as_secs_f64(),
        run.rec.errors
    );
    for (op, _) in run.rec.ops() {
        line.push_str("; ");
        line.push_str(&quantiles(&run.rec, op));
    }
    let cpu = after.cpu_micros.saturating_sub(before.cpu_micros);
    if cpu > 0 {
        line.push_str(&format!("; server CPU {:.0} µs/op", cpu as f64 / ops));
    }
    if kind == Kind::Fenced && after.applied_entries > before.applied_entries {
        let entries = after.applied_entries - before.applied_entries;
        let commands = after
            .applied_commands
            .saturating_sub(before.applied_commands);
        let syncs = after.log_syncs.saturating_sub(before.log_syncs);
        line.push_str(&format!(
            "; {:.1} commands/entry; {:.3} fsyncs/op (all nodes)",
            commands as f64 / entries as f64,
            syncs as f64 / ops
        ));
    }
    if let Some(n) = before.elections_until(&after) {
        // Elections during the run: none should happen that no fault caused.
        line.push_str(&format!("; elections {n}"));
    }
    for (k, v) in &run.extra {
        line.push_str(&format!("; {k} {v:.2}"));
    }
    println!("{line}");
    if let Some(e) = &run.rec.first_error {
        println!("    first error: {e}");
    }
}

pub fn micros_ms(m: Option<u64>) -> f64 {
    m.map_or(f64::NAN, |m| m as f64 / 1000.0)
}

pub fn targets(table: &Table) {
    let check = |what: &str, ok: Option<bool>| {
        println!(
            "target {what}: {}",
            match ok {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "not measured",
            }
        );
    };
    let r = |l: &str, k| table.ratio(l, k);
    check(
        "S1 p50 <= half of etcd's",
        r("S1 cycle p50 (ms)", Kind::Etcd).map(|x| x >= 2.0),
    );
    check(
        "S1 p50 <= the replicated PostgreSQL's",
        r("S1 cycle p50 (ms)", Kind::PostgresSync).map(|x| x >= 1.0),
    );
    check(
        "S2 64 clients cycles/s >= 3x etcd",
        r("S2 64 clients: cycles/s", Kind::Etcd).map(|x| x >= 3.0),
    );
    check(
        "S2 64 clients cycles/s >= 1.3x the replicated PostgreSQL",
        r("S2 64 clients: cycles/s", Kind::PostgresSync).map(|x| x >= 1.3),
    );
    check(
        "S2 64 clients cycles/s > the single-node PostgreSQL",
        r("S2 64 clients: cycles/s", Kind::Postgres).map(|x| x > 1.0),
    );
    check(
        "S2 64 clients p99 <= a quarter of etcd's",
        r("S2 64 clients: cycle p99 (ms)", Kind::Etcd).map(|x| x >= 4.0),
    );
    check(
        "S3 16 clients hand-offs/s >= 5x etcd",
        r("S3 16 clients: hand-offs/s", Kind::Etcd).map(|x| x >= 5.0),
    );
    check(
        "rolling restart: longest gap between grants under 1 s",
        table
            .get(
                "Rolling restart: longest gap between grants (ms)",
                Kind::Fenced,
            )
            .map(|ms| ms < 1_000.0),
    );
}

/// Writes the chart where `--chart` says and prints its path.
pub fn write_chart(args: &Args, table: &Table) -> Result<()> {
    let title = format!(
        "fenced-bench: {} s per run, {} round{}{}{}",
        args.duration_s,
        args.rounds,
        if args.rounds == 1 { "" } else { "s (medians)" },
        if args.fenced_tls {
            ", fenced with TLS"
        } else {
            ""
        },
        if cfg!(debug_assertions) {
            ", DEBUG build: the figures mean nothing"
        } else {
            ""
        },
    );
    let svg = chart::render(&table.chart(title, &args.s2_clients));
    std::fs::write(&args.chart, svg).with_context(|| format!("chart {}", args.chart.display()))?;
    println!("chart: {}", args.chart.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_figure_is_the_median_of_its_rounds_and_ratios_compare_medians() {
        let mut t = Table::default();
        for v in [3.0, 1.0, 2.0] {
            t.put("cycle p50", Kind::Fenced, v, false);
        }
        for v in [9.0, 4.0, 5.0] {
            t.put("cycle p50", Kind::Etcd, v, false);
        }
        assert_eq!(t.get("cycle p50", Kind::Fenced), Some(2.0));
        assert_eq!(t.get("cycle p50", Kind::Etcd), Some(5.0));
        assert_eq!(t.ratio("cycle p50", Kind::Etcd), Some(2.5));
        t.put("cycles/s", Kind::Fenced, 10.0, true);
        t.put("cycles/s", Kind::Fenced, 30.0, true);
        t.put("cycles/s", Kind::Postgres, 40.0, true);
        assert_eq!(t.get("cycles/s", Kind::Fenced), Some(20.0));
        assert_eq!(t.ratio("cycles/s", Kind::Postgres), Some(0.5));
        assert_eq!(t.get("cycles/s", Kind::Etcd), None);
    }

    #[test]
    fn the_chart_takes_s2_throughput_by_clients_and_median_percentiles() {
        let mut t = Table::default();
        for (kind, scale) in [(Kind::Fenced, 2.0), (Kind::Etcd, 1.0)] {
            for n in [1, 16] {
                t.put(
                    &format!("S2 {n} clients: cycles/s"),
                    kind,
                    scale * n as f64,
                    true,
                );
            }
        }
        for micros in [1_000, 3_000, 2_000] {
            let mut rec = Recorder::new();
            rec.record("cycle", Duration::from_micros(micros));
            let run = Run {
                ops: 1,
                elapsed: Duration::from_secs(1),
                rec,
                extra: BTreeMap::new(),
            };
            t.put_percentiles("S1 1 client, cycle", Kind::Fenced, &run, "cycle");
        }
        let data = t.chart("title".into(), &[1, 16, 64]);
        assert_eq!(data.throughput.len(), 2);
        assert_eq!(data.throughput[0].system, "fenced");
        assert_eq!(data.throughput[0].points, vec![(1, 2.0), (16, 32.0)]);
        assert_eq!(data.throughput[1].points, vec![(1, 1.0), (16, 16.0)]);
        assert_eq!(data.latency.len(), 1);
        let row = &data.latency[0];
        assert_eq!(
            (row.scenario.as_str(), row.system.as_str()),
            ("S1 1 client, cycle", "fenced")
        );
        // The median of the three rounds, within the histogram's precision.
        assert!((row.p50 - 2.0).abs() < 0.01, "{row:?}");
    }
}
