//! A sweep of `settle bench chain` or `fanout` over several concurrencies
//! (`--concurrency 32,64,128 --rounds 3`): the benchmark runs at each concurrency
//! `--rounds` times, ascending in the first round, descending in the next and so on, so
//! that a host whose speed drifts during the sweep weighs on every concurrency alike. The
//! report gives each concurrency's medians, the peak (the highest median throughput) and
//! the knee (the least concurrency whose median throughput is within [`KNEE_SHARE`] of the
//! peak's), each with its latency: a closed loop's latency is its concurrency over its
//! throughput, so where throughput stops growing is where more in flight only adds wait.
//!
//! A sweep of the open loop (`--rate 4000,8000 --rounds 3`, [`super::open`]) goes the same
//! way over rates and reports, instead of a peak and a knee, the highest rate the engine
//! kept up with (its median throughput at least [`KEPT_UP_SHARE`] of the rate) and the
//! latency there.

use serde_json::{Value, json};

use super::measure::{median, peak_rss_mb, round3};
use super::open::{self, KEPT_UP_SHARE};

/// How a benchmark starts its workflows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loop {
    /// So many in flight, the next started as one ends (`--concurrency`).
    Closed,
    /// So many started a second, however many are in flight (`--rate`).
    Open,
}

impl Loop {
    /// The option that sets the level.
    pub(super) fn flag(self) -> &'static str {
        match self {
            Loop::Closed => "--concurrency",
            Loop::Open => "--rate",
        }
    }

    /// The report's name of the level.
    fn key(self) -> &'static str {
        match self {
            Loop::Closed => "concurrency",
            Loop::Open => "rate",
        }
    }
}

/// The knee is the least concurrency whose median throughput is at least this share of
/// the peak's.
pub(super) const KNEE_SHARE: f64 = 0.9;

/// One run of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Run {
    /// The concurrency (closed loop) or the rate (open loop).
    pub level: usize,
    pub workflows_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The runs of one level and their medians.
#[derive(Debug)]
pub(super) struct Point {
    pub level: usize,
    pub runs: Vec<Run>,
    pub workflows_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The order of a sweep's runs: every level (concurrency or rate, as `lp` says) once a
/// round, ascending in odd rounds and descending in even ones. Refuses an empty list, a
/// zero, a level listed twice and zero rounds.
pub(super) fn order(levels: &[usize], rounds: usize, lp: Loop) -> anyhow::Result<Vec<usize>> {
    let flag = lp.flag();
    if levels.is_empty() || levels.contains(&0) {
        anyhow::bail!("{flag} must be at least 1 (got {levels:?})");
    }
    if rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    let mut sorted = levels.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        anyhow::bail!("{flag} lists {} twice", w[0]);
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

/// The runs grouped by level, ascending, with their medians.
pub(super) fn summarize(runs: &[Run]) -> Vec<Point> {
    let mut levels: Vec<usize> = runs.iter().map(|r| r.level).collect();
    levels.sort_unstable();
    levels.dedup();
    levels
        .into_iter()
        .map(|level| {
            let runs: Vec<Run> = runs.iter().filter(|r| r.level == level).cloned().collect();
            let of = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
            Point {
                level,
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

/// The highest rate of an open loop's sweep whose median throughput is at least
/// [`KEPT_UP_SHARE`] of it, if any.
pub(super) fn kept_up(points: &[Point]) -> Option<&Point> {
    points.iter().rev().find(|p| open::kept_up(p.workflows_per_s, p.level))
}

fn point_json(p: &Point, lp: Loop) -> Value {
    json!({
        lp.key(): p.level,
        "workflows_per_s": round3(p.workflows_per_s),
        "p50_ms": round3(p.p50_ms),
        "p99_ms": round3(p.p99_ms),
    })
}

/// Prints a sweep's report: one JSON line (`sweep`, each level's medians and runs; for a
/// closed loop `peak` and `knee`, for an open one `kept_up`; the bench's own fields from
/// `extra`), or a table for people.
pub(super) fn report(json_out: bool, points: &[Point], extra: Value, lp: Loop) {
    let (peak, knee, kept) = (peak(points), knee(points), kept_up(points));
    if json_out {
        let sweep: Vec<Value> = points
            .iter()
            .map(|p| {
                let mut v = point_json(p, lp);
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
            "peak_rss_mb": round3(peak_rss_mb()),
        });
        match lp {
            Loop::Closed => {
                v["peak"] = point_json(peak, lp);
                v["knee"] = point_json(knee, lp);
                v["knee_share"] = json!(KNEE_SHARE);
            }
            Loop::Open => {
                v["kept_up"] = kept.map_or(Value::Null, |p| point_json(p, lp));
                v["kept_up_share"] = json!(KEPT_UP_SHARE);
            }
        }
        if let (Some(obj), Some(more)) = (v.as_object_mut(), extra.as_object()) {
            obj.extend(more.clone());
        }
        println!("{v}");
        return;
    }
    let head = match lp {
        Loop::Closed => "in flight",
        Loop::Open => "  rate/s ",
    };
    println!("{head}  workflows/s   p50 ms   p99 ms  (medians of {} runs each)", points[0].runs.len());
    for p in points {
        let mark = match lp {
            Loop::Closed => match (p.level == peak.level, p.level == knee.level) {
                (true, true) => "  peak, knee",
                (true, false) => "  peak",
                (false, true) => "  knee",
                _ => "",
            },
            Loop::Open if !open::kept_up(p.workflows_per_s, p.level) => "  fell behind",
            Loop::Open => "",
        };
        println!("{:>9}  {:>11.0}  {:>7.2}  {:>7.2}{mark}", p.level, p.workflows_per_s, p.p50_ms, p.p99_ms);
    }
    let share = |s: f64| (s * 100.0).round();
    match (lp, kept) {
        (Loop::Closed, _) => println!(
            "peak: {} in flight, {:.0} workflows/s, p99 {:.2} ms; knee (the least within {:.0} % of the peak): {} in flight, {:.0} workflows/s, p99 {:.2} ms",
            peak.level,
            peak.workflows_per_s,
            peak.p99_ms,
            100.0 - share(KNEE_SHARE),
            knee.level,
            knee.workflows_per_s,
            knee.p99_ms
        ),
        (Loop::Open, Some(k)) => println!(
            "kept up (at least {:.0} % of the rate) up to {}/s: {:.0} workflows/s, p50 {:.2} ms, p99 {:.2} ms",
            share(KEPT_UP_SHARE),
            k.level,
            k.workflows_per_s,
            k.p50_ms,
            k.p99_ms
        ),
        (Loop::Open, None) => {
            println!("kept up (at least {:.0} % of the rate) with none of the rates", share(KEPT_UP_SHARE))
        }
    }
    println!("peak RSS of the sweep: {:.1} MiB", peak_rss_mb());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(level: usize, workflows_per_s: f64, p99_ms: f64) -> Run {
        Run { level, workflows_per_s, p50_ms: p99_ms / 2.0, p99_ms }
    }

    #[test]
    fn rounds_alternate_their_order() {
        assert_eq!(order(&[64, 32, 128], 3, Loop::Closed).unwrap(), [32, 64, 128, 128, 64, 32, 32, 64, 128]);
        assert_eq!(order(&[64], 1, Loop::Closed).unwrap(), [64]);
    }

    #[test]
    fn a_bad_sweep_is_refused() {
        assert!(order(&[], 1, Loop::Closed).unwrap_err().to_string().contains("at least 1"));
        assert!(order(&[32, 0], 1, Loop::Open).unwrap_err().to_string().contains("at least 1"));
        assert_eq!(order(&[32, 64, 32], 1, Loop::Closed).unwrap_err().to_string(), "--concurrency lists 32 twice");
        assert_eq!(order(&[8, 8], 1, Loop::Open).unwrap_err().to_string(), "--rate lists 8 twice");
        assert_eq!(order(&[32], 0, Loop::Closed).unwrap_err().to_string(), "--rounds must be at least 1");
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
        assert_eq!(points.iter().map(|p| p.level).collect::<Vec<_>>(), [32, 64, 128]);
        assert_eq!(points[0].workflows_per_s, 3000.0);
        assert_eq!(points[1].workflows_per_s, 5300.0);
        assert_eq!((points[2].workflows_per_s, points[2].p99_ms), (5800.0, 28.0));
        assert_eq!(points[2].runs.len(), 3);
        assert_eq!(peak(&points).level, 128);
        // 5,300 is within 10 % of 5,800 (5,220 and up); 3,000 is not.
        assert_eq!(knee(&points).level, 64);
    }

    #[test]
    fn an_even_count_takes_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn a_tie_at_the_peak_goes_to_the_lower_concurrency() {
        let points = summarize(&[run(32, 5000.0, 10.0), run(64, 5000.0, 20.0)]);
        assert_eq!(peak(&points).level, 32);
        assert_eq!(knee(&points).level, 32);
    }

    /// An open loop kept up with a rate when its median throughput is at least 95 % of it;
    /// the highest such rate is reported, even above one it fell behind at.
    #[test]
    fn the_highest_rate_kept_up_with() {
        let points = summarize(&[run(1000, 990.0, 5.0), run(2000, 1950.0, 8.0), run(4000, 3000.0, 900.0)]);
        assert_eq!(kept_up(&points).map(|p| p.level), Some(2000));
        let points = summarize(&[run(1000, 940.0, 5.0)]);
        assert!(kept_up(&points).is_none());
        let points = summarize(&[run(1000, 900.0, 5.0), run(2000, 1900.0, 8.0)]);
        assert_eq!(kept_up(&points).map(|p| p.level), Some(2000));
    }
}
