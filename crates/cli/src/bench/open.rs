//! The open loop of `settle bench chain` and `fanout` (`--rate R`): workflows start on a
//! fixed schedule, `R` a second, however many are in flight, as requests reach a service
//! from many independent callers. A closed loop (`--concurrency C`) starts the next
//! workflow only when one ends, so its latency is `C` over its throughput whatever the
//! engine does, and the concurrency that gives the most throughput is the one of the
//! longest waits; an open loop measures the latency at a given load instead. Each
//! latency counts from the workflow's scheduled start, not from when it was started: a
//! start the load generator could not make on time (a backlog, a busy host) counts
//! against the engine rather than being left out of the sample.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Below this share of the offered rate, the engine did not keep up with it.
pub(super) const KEPT_UP_SHARE: f64 = 0.95;

/// Whether a run at `rate` a second that did `workflows_per_s` kept up with it (at least
/// [`KEPT_UP_SHARE`] of it).
pub(super) fn kept_up(workflows_per_s: f64, rate: usize) -> bool {
    workflows_per_s >= KEPT_UP_SHARE * rate as f64
}

/// When workflow `i` of a run at `rate` a second starts, after the run's start.
pub(super) fn offset(i: usize, rate: usize) -> Duration {
    Duration::from_nanos((i as u128 * 1_000_000_000 / rate.max(1) as u128) as u64)
}

/// Runs one workflow per key, workflow `i` started at [`offset`]`(i, rate)`; returns the
/// seconds from the first scheduled start to the last end, and each workflow's latency
/// from its scheduled start, sorted.
pub(super) async fn drive<F, Fut>(keys: &Arc<Vec<String>>, rate: usize, one: F) -> anyhow::Result<(f64, Vec<Duration>)>
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    anyhow::ensure!(rate > 0, "--rate must be at least 1");
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut latencies = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let at = start + offset(i, rate);
        tokio::time::sleep_until(at).await;
        let (one, key) = (one.clone(), key.clone());
        tasks.spawn(async move {
            one(key).await?;
            anyhow::Ok(at.elapsed())
        });
        // Take what has ended as it goes: memory follows what is in flight, not the run.
        while let Some(done) = tasks.try_join_next() {
            latencies.push(done??);
        }
    }
    while let Some(done) = tasks.join_next().await {
        latencies.push(done??);
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok((seconds, latencies))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_up_is_at_least_95_percent_of_the_rate() {
        assert!(kept_up(950.0, 1000));
        assert!(!kept_up(949.9, 1000));
    }

    #[test]
    fn starts_are_evenly_spread_over_the_second() {
        assert_eq!(offset(0, 4), Duration::ZERO);
        assert_eq!(offset(1, 4), Duration::from_millis(250));
        assert_eq!(offset(8, 4), Duration::from_secs(2));
        assert_eq!(offset(3, 3_000_000), Duration::from_nanos(1_000));
    }

    /// Starts follow the schedule however long each workflow takes, and a latency counts
    /// from the scheduled start: with time paused, 10 workflows at 100 a second that take
    /// 45 ms each all start within 90 ms, so at most five are in flight at once and the
    /// run ends at 135 ms.
    #[tokio::test(start_paused = true)]
    async fn an_open_loop_keeps_its_schedule() {
        let keys = Arc::new((0..10).map(|i| i.to_string()).collect::<Vec<_>>());
        let (now, most) = (Arc::new(std::sync::atomic::AtomicUsize::new(0)), Arc::new(std::sync::Mutex::new(0)));
        let (n, m) = (now.clone(), most.clone());
        let (seconds, latencies) = drive(&keys, 100, move |_| {
            let (n, m) = (n.clone(), m.clone());
            async move {
                let in_flight = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                {
                    let mut most = m.lock().unwrap();
                    *most = (*most).max(in_flight);
                }
                tokio::time::sleep(Duration::from_millis(45)).await;
                n.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        })
        .await
        .unwrap();
        assert_eq!(latencies.len(), 10);
        assert!(latencies.iter().all(|l| *l == Duration::from_millis(45)), "{latencies:?}");
        assert_eq!(*most.lock().unwrap(), 5);
        assert!((seconds - 0.135).abs() < 1e-9, "{seconds}");
    }

    /// A start made late counts against its workflow: the first workflow holds the
    /// driver up for 30 ms (time moved on under it), so the next three start together at
    /// 30 ms, and their latencies count from 10, 20 and 30 ms.
    #[tokio::test(start_paused = true)]
    async fn a_late_start_counts() {
        let keys = Arc::new((0..4).map(|i| i.to_string()).collect::<Vec<_>>());
        let (_, latencies) = drive(&keys, 100, |k| async move {
            if k == "0" {
                tokio::time::advance(Duration::from_millis(30)).await;
            }
            tokio::time::sleep(Duration::from_millis(45)).await;
            Ok(())
        })
        .await
        .unwrap();
        let ms: Vec<u128> = latencies.iter().map(|l| l.as_millis()).collect();
        assert_eq!(ms, [45, 55, 65, 75]);
    }

    /// A workflow that fails fails the run.
    #[tokio::test(start_paused = true)]
    async fn a_failed_workflow_fails_the_run() {
        let keys = Arc::new(vec!["a".to_string(), "b".to_string()]);
        let err = drive(&keys, 10, |k| async move { if k == "b" { anyhow::bail!("{k} broke") } else { Ok(()) } })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "b broke");
        assert!(drive(&keys, 0, |_| async { Ok(()) }).await.is_err());
    }
}
