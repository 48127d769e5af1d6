//! A sweep of `settle bench chain` or `fanout` over several concurrencies
//! (`--concurrency 32,64,128 --rounds 3`): the benchmark runs at each concurrency
//! `--rounds` times, ascending in the first round, descending in the next and so on, so
//! that a host whose speed drifts during the sweep weighs on every concurrency alike. The
//! report gives each concurrency's medians, the peak (the highest median throughput) and
//! the knee (the least concurrency whose median throughput is within [`KNEE_SHARE`] of the
//! peak's), each with its latency: a closed loop's latency is its concurrency over its
//! throughput, so where throughput stops growing is where more in flight only adds wait.

use serde_json::{Value, json};

use super::measure::{median, peak_rss_mb, round3};

/// The knee is the least concurrency whose median throughput is at least this share of
/// the peak's.
pub(super) const KNEE_SHARE: f64 = 0.9;

/// One run of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Run {
    pub concurrency: usize,
    pub workflows_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The runs of one concurrency and their medians.
#[derive(Debug)]
pub(super) struct Point {
    pub concurrency: usize,
    pub runs: Vec<Run>,
    pub workflows_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The order of a sweep's runs: every concurrency once a round, ascending in odd rounds
/// and descending in even ones. Refuses an empty list, a zero, a concurrency listed twice
/// and zero rounds.
pub(super) fn order(concurrency: &[usize], rounds: usize) -> anyhow::Result<Vec<usize>> {
    if concurrency.is_empty() || concurrency.contains(&0) {
        anyhow::bail!("--concurrency must be at least 1 (got {concurrency:?})");
    }
    if rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    let mut sorted = concurrency.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        anyhow::bail!("--concurrency lists {} twice", w[0]);
    }
    let mut out = Vec::with_capacity(sorted.len() * rounds);
    for round in 0..rounds {
        if round % 2 == 0 {
            out.extend(sorted.iter().copied());
        } else {
            out.extend(sorted.iter().rev().copied());
        }
    }
    Ok(out)
}

/// The runs grouped by concurrency, ascending, with their medians.
pub(super) fn summarize(runs: &[Run]) -> Vec<Point> {
    let mut levels: Vec<usize> = runs.iter().map(|r| r.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    levels
        .into_iter()
        .map(|concurrency| {
            let runs: Vec<Run> = runs.iter().filter(|r| r.concurrency == concurrency).cloned().collect();
            let of = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
            Point {
                concurrency,
                workflows_per_s: of(|r| r.workflows_per_s),
                p50_ms: of(|r| r.p50_ms),
                p99_ms: of(|r| r.p99_ms),
                runs,
            }
        })
        .collect()
}

/// The point of the highest median throughput (the lower concurrency of a tie).
pub(super) fn peak(points: &[Point]) -> &Point {
    points.iter().fold(&points[0], |best, p| if p.workflows_per_s > best.workflows_per_s { p } else { best })
}

/// The least concurrency whose median throughput is at least [`KNEE_SHARE`] of the peak's.
pub(super) fn knee(points: &[Point]) -> &Point {
    let top = peak(points).workflows_per_s;
    points.iter().find(|p| p.workflows_per_s >= KNEE_SHARE * top).unwrap_or(&points[0])
}

fn point_json(p: &Point) -> Value {
    json!({
        "concurrency": p.concurrency,
        "workflows_per_s": round3(p.workflows_per_s),
        "p50_ms": round3(p.p50_ms),
        "p99_ms": round3(p.p99_ms),
    })
}

/// Prints a sweep's report: one JSON line (`sweep`, each concurrency's medians and runs;
/// `peak`; `knee`; the bench's own fields from `extra`), or a table for people.
pub(super) fn report(json_out: bool, points: &[Point], extra: Value) {
    let (peak, knee) = (peak(points), knee(points));
    if json_out {
        let sweep: Vec<Value> = points
            .iter()
            .map(|p| {
                let mut v = point_json(p);
                v["runs"] = p
                    .runs
                    .iter()
                    .map(|r| json!([round3(r.workflows_per_s), round3(r.p50_ms), round3(r.p99_ms)]))
                    .collect();
                v
            })
            .collect();
        let mut v = json!({
            "sweep": sweep,
            "runs_are": ["workflows_per_s", "p50_ms", "p99_ms"],
            "peak": point_json(peak),
            "knee": point_json(knee),
            "knee_share": KNEE_SHARE,
            "peak_rss_mb": round3(peak_rss_mb()),
        });
        if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
            obj.extend(more.clone());
        }
        println!("{v}");
        return;
    }
    println!("in flight  workflows/s   p50 ms   p99 ms  (medians of {} runs each)", points[0].runs.len());
    for p in points {
        let mark = match (p.concurrency == peak.concurrency, p.concurrency == knee.concurrency) {
            (true, true) => "  peak, knee",
            (true, false) => "  peak",
            (false, true) => "  knee",
            _ => "",
        };
        println!("{:>9}  {:>11.0}  {:>7.2}  {:>7.2}{mark}", p.concurrency, p.workflows_per_s, p.p50_ms, p.p99_ms);
    }
    println!(
        "peak: {} in flight, {:.0} workflows/s, p99 {:.2} ms; knee (the least within {:.0} % of the peak): {} in flight, {:.0} workflows/s, p99 {:.2} ms",
        peak.concurrency,
        peak.workflows_per_s,
        peak.p99_ms,
        (1.0 - KNEE_SHARE) * 100.0,
        knee.concurrency,
        knee.workflows_per_s,
        knee.p99_ms
    );
    println!("peak RSS of the sweep: {:.1} MiB", peak_rss_mb());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(concurrency: usize, workflows_per_s: f64, p99_ms: f64) -> Run {
        Run { concurrency, workflows_per_s, p50_ms: p99_ms / 2.0, p99_ms }
    }

    #[test]
    fn rounds_alternate_their_order() {
        assert_eq!(order(&[64, 32, 128], 3).unwrap(), [32, 64, 128, 128, 64, 32, 32, 64, 128]);
        assert_eq!(order(&[64], 1).unwrap(), [64]);
    }

    #[test]
    fn a_bad_sweep_is_refused() {
        assert!(order(&[], 1).unwrap_err().to_string().contains("at least 1"));
        assert!(order(&[32, 0], 1).unwrap_err().to_string().contains("at least 1"));
        assert_eq!(order(&[32, 64, 32], 1).unwrap_err().to_string(), "--concurrency lists 32 twice");
        assert_eq!(order(&[32], 0).unwrap_err().to_string(), "--rounds must be at least 1");
    }

    #[test]
    fn medians_peak_and_knee() {
        let runs = [
            run(32, 3000.0, 10.0),
            run(64, 5000.0, 14.0),
            run(128, 5600.0, 25.0),
            run(128, 6000.0, 30.0),
            run(64, 5400.0, 16.0),
            run(32, 3200.0, 12.0),
            run(32, 2900.0, 11.0),
            run(64, 5300.0, 15.0),
            run(128, 5800.0, 28.0),
        ];
        let points = summarize(&runs);
        assert_eq!(points.iter().map(|p| p.concurrency).collect::<Vec<_>>(), [32, 64, 128]);
        assert_eq!(points[0].workflows_per_s, 3000.0);
        assert_eq!(points[1].workflows_per_s, 5300.0);
        assert_eq!((points[2].workflows_per_s, points[2].p99_ms), (5800.0, 28.0));
        assert_eq!(points[2].runs.len(), 3);
        assert_eq!(peak(&points).concurrency, 128);
        // 5,300 is within 10 % of 5,800 (5,220 and up); 3,000 is not.
        assert_eq!(knee(&points).concurrency, 64);
    }

    #[test]
    fn an_even_count_takes_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn a_tie_at_the_peak_goes_to_the_lower_concurrency() {
        let points = summarize(&[run(32, 5000.0, 10.0), run(64, 5000.0, 20.0)]);
        assert_eq!(peak(&points).concurrency, 32);
        assert_eq!(knee(&points).concurrency, 32);
    }
}
