//! `settle bench fleet`: what an operator's reads cost on a large fleet. It writes N
//! entities of one nested machine spread over its states (1 % paused, 0.5 % parked for an
//! operator), then times the dashboard's reads: the overview (counts by machine, state and
//! run status; backlog; operations by outcome; transitions and errors per minute) and a
//! page of 50 entities under each kind of filter. Medians over `--repeat` calls.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;
use settle_core::{EntityKey, MachineName, StateName};
use settle_store::{AnyStore, Applied, Batch, Command, EntityFilter, EntityOrder, NewEntity, Op, Store, TimerPlan};

use super::measure::round3;

/// Options of `settle bench fleet`.
#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// Entities to write (skipped when the database already holds at least this many).
    #[arg(long, default_value_t = 1_000_000)]
    entities: usize,
    /// Calls per read timed (the median is reported).
    #[arg(long, default_value_t = 21)]
    repeat: usize,
    /// Print one JSON line.
    #[arg(long)]
    json: bool,
}

/// The machine of the fleet: `fleet`, whose states the entities are spread over
/// (`provisioning` is a parent of `creating` and `configuring`).
pub const FLEET_MACHINE: &str = "fleet";

/// The leaf states of `fleet` and how many entities in 1,000 are in each. The rare state
/// (`broken`, 0.6 %) fills a page of 50 from 10,000 entities on, so that its page is the
/// same read at every size compared.
const SPREAD: [(&str, usize); 6] =
    [("running", 900), ("creating", 40), ("configuring", 30), ("stopped", 20), ("deleting", 4), ("broken", 6)];

/// Entities per write while seeding.
/// Entities written per store batch when seeding (also `bench dormant`'s).
pub(crate) const SEED_BATCH: usize = 5_000;

/// The state of the `i`th entity, by [`SPREAD`].
fn state_of(i: usize) -> &'static str {
    let mut r = i % 1000;
    for (state, n) in SPREAD {
        if r < n {
            return state;
        }
        r -= n;
    }
    unreachable!("SPREAD adds up to 1000")
}

pub async fn fleet(db: &str, args: FleetArgs) -> anyhow::Result<ExitCode> {
    if args.entities == 0 || args.repeat == 0 {
        bail!("--entities and --repeat must be at least 1");
    }
    let store = AnyStore::open(db)?;
    let now = settle_store::clock::now_ms();
    let present: u64 = store.overview(now, now).await?.entities.iter().map(|c| c.count).sum();
    let seeded = Instant::now();
    if (present as usize) < args.entities {
        seed(&store, present as usize, args.entities, args.json).await?;
    }
    let seed_s = seeded.elapsed().as_secs_f64();
    let filter = |f: EntityFilter| EntityFilter { limit: Some(51), ..f };
    let machine = || Some(FLEET_MACHINE.to_string());
    let (middle, last) = (format!("srv-{:07}", args.entities / 2), format!("srv-{:07}", args.entities - 1));
    let lists: Vec<(&str, EntityFilter)> = vec![
        ("machine", filter(EntityFilter { machine: machine(), ..Default::default() })),
        ("rare_state", filter(EntityFilter { machine: machine(), state: Some("broken".into()), ..Default::default() })),
        (
            "parent_state",
            filter(EntityFilter {
                machine: machine(),
                state: Some("provisioning".into()),
                substates: vec![
                    (FLEET_MACHINE.into(), "creating".into()),
                    (FLEET_MACHINE.into(), "configuring".into()),
                ],
                ..Default::default()
            }),
        ),
        ("parked", filter(EntityFilter { run_status: Some("failed".into()), ..Default::default() })),
        ("paused_running", {
            let f =
                EntityFilter { state: Some("running".into()), run_status: Some("paused".into()), ..Default::default() };
            filter(f)
        }),
        // A hundred keys or more (the middle one's, its last two digits cut), and one key.
        (
            "key_prefix",
            filter(EntityFilter { key_prefix: Some(middle[..middle.len() - 2].into()), ..Default::default() }),
        ),
        ("rare_key_prefix", filter(EntityFilter { key_prefix: Some(last), ..Default::default() })),
        // By entered time: longest in its state first over the machine, the newest of a
        // rare state.
        (
            "entered",
            filter(EntityFilter { machine: machine(), order: EntityOrder::EnteredFirst, ..Default::default() }),
        ),
        (
            "rare_state_newest",
            filter(EntityFilter {
                machine: machine(),
                state: Some("broken".into()),
                order: EntityOrder::EnteredLast,
                ..Default::default()
            }),
        ),
    ];
    let mut results = serde_json::Map::new();
    let overview = median(args.repeat, || async {
        let now = settle_store::clock::now_ms();
        store.overview(now, now - 3_600_000).await.map(|o| o.entities.len())
    })
    .await?;
    results.insert("overview_ms".into(), json!(overview.0));
    for (name, f) in &lists {
        let (ms, rows) = median(args.repeat, || async { store.entity_list(f.clone()).await.map(|r| r.len()) }).await?;
        if rows == 0 {
            bail!("the `{name}` page is empty: the fleet was not seeded as expected");
        }
        results.insert(format!("list_{name}_ms"), json!(ms));
    }
    // A page's total, as the dashboard asks for it (`total=true`: exact up to 10,000),
    // for a rare state and for the most common one (more than the bound at scale).
    for (name, state) in [("rare_state", "broken"), ("common_state", "running")] {
        let f = EntityFilter { machine: machine(), state: Some(state.into()), ..Default::default() };
        let (ms, _) = median(args.repeat, || async { store.entity_count(f.clone(), 10_000).await }).await?;
        results.insert(format!("total_{name}_ms"), json!(ms));
    }
    let total: u64 = store.overview(now, now).await?.entities.iter().map(|c| c.count).sum();
    results.insert("entities".into(), json!(total));
    results.insert("seed_s".into(), json!(round3(seed_s)));
    if args.json {
        println!("{}", serde_json::Value::Object(results));
    } else {
        println!("{total} entities ({seed_s:.1} s to seed); medians of {} calls:", args.repeat);
        for (k, v) in &results {
            if let Some(read) = k.strip_suffix("_ms") {
                println!("  {read:<24} {v} ms");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The median time of `repeat` calls of `read` in ms (3 decimals), and what the last
/// call returned.
async fn median<F, Fut, T>(repeat: usize, read: F) -> anyhow::Result<(f64, T)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = settle_store::Result<T>>,
{
    let mut times = Vec::with_capacity(repeat);
    let mut last = None;
    for _ in 0..repeat {
        let t = Instant::now();
        last = Some(read().await?);
        times.push(t.elapsed());
    }
    times.sort();
    Ok((round3(times[times.len() / 2].as_secs_f64() * 1000.0), last.expect("repeat ≥ 1")))
}

/// The creation of entity `key` of `machine` in `state`, at rest (nothing due but its
/// `timers`), written straight to the store: how the benches seed large fleets.
pub(crate) fn at_rest(machine: &str, key: String, state: &str, timers: Vec<TimerPlan>) -> Op {
    Op::Create(NewEntity {
        machine: MachineName::new(machine),
        key: EntityKey::new(key),
        state: StateName::new(state),
        properties: Default::default(),
        auto_at: None,
        request_id: None,
        timers,
        notify_self: false,
        operation: None,
        machine_hash: None,
        health: "ok",
        offer: None,
    })
}

/// Writes one batch of creations; answers the entities' ids in order.
pub(crate) async fn write_creates(store: &AnyStore, ops: Vec<Op>) -> anyhow::Result<Vec<i64>> {
    let r = store.write(Batch { now: settle_store::clock::now_ms(), ops, claim: None }).await?;
    r.results
        .into_iter()
        .map(|r| match r {
            Ok(Applied::Created(e)) => Ok(e.id),
            Ok(other) => bail!("seeding wrote something else: {other:?}"),
            Err(e) => bail!("seeding failed (use a fresh database): {e}"),
        })
        .collect()
}

/// Writes entities `from..to` of `fleet` (keys `srv-0000000`…), then pauses 1 % of the
/// `running` ones and parks 0.5 % of them (run status `failed`).
async fn seed(store: &AnyStore, from: usize, to: usize, quiet: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut i = from;
    while i < to {
        let end = (i + SEED_BATCH).min(to);
        let ops = (i..end).map(|n| at_rest(FLEET_MACHINE, format!("srv-{n:07}"), state_of(n), Vec::new())).collect();
        write_creates(store, ops).await?;
        let mut commands = Vec::new();
        for n in (i..end).filter(|n| state_of(*n) == "running") {
            if n % 100 != 0 {
                continue;
            }
            commands.push(Op::Command {
                machine: MachineName::new(FLEET_MACHINE),
                key: EntityKey::new(format!("srv-{n:07}")),
                command: Command::Pause,
                operation: None,
            });
        }
        if !commands.is_empty() {
            store.write(Batch { now: settle_store::clock::now_ms(), ops: commands, claim: None }).await?;
        }
        i = end;
        if !quiet && last_report.elapsed() >= Duration::from_secs(2) {
            let rate = (i - from) as f64 / started.elapsed().as_secs_f64();
            eprintln!("seeded {i} of {to} entities ({rate:.0}/s)");
            last_report = Instant::now();
        }
    }
    // Parked for an operator: only a failing action parks, so the seed sets it directly
    // (the counts follow: the store's triggers keep them). A fixed statement, no input.
    store
        .sql_execute(
            "UPDATE entities SET run_status = 'failed'
             WHERE machine = 'fleet' AND state = 'running' AND run_status = 'active' AND id % 200 = 7",
        )
        .await?;
    Ok(())
}
