//! A minimal external agent: serves one queue of a Settle server, reporting every task
//! done with its action's first declared target. Run a server with an agent-bound action
//! (`agent = "jobs"` in its TOML), then:
//!
//! ```text
//! cargo run -p settle-client --example agent -- http://127.0.0.1:7400 jobs [TOKEN]
//! ```
//!
//! A real agent calls its provider where this one sleeps, heartbeats while the call takes
//! longer than a third of the task's lock, and reports `fail` when the call fails.

use std::time::Duration;

use settle_client::{Client, Error};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(server), Some(queue)) = (args.next(), args.next()) else {
        eprintln!("usage: agent SERVER_URL QUEUE [TOKEN]");
        std::process::exit(2);
    };
    let mut client = Client::new(&server)?;
    if let Some(token) = args.next() {
        client = client.with_token(token);
    }
    let me = format!("example-agent-{}", std::process::id());
    loop {
        for task in client.lease(&queue, &me, 4, Duration::from_secs(20)).await? {
            println!("task {} attempt {}: {} {} runs {}", task.id, task.attempt, task.machine, task.key, task.action);
            tokio::time::sleep(Duration::from_millis(100)).await; // the provider call
            let target = task.targets.first().cloned().unwrap_or_default();
            match client.complete(&task, &target, serde_json::json!({"done_by": me})).await {
                Ok(()) => {}
                // The lease ran out or the entity moved on: nothing changed; drop it.
                Err(e) if e.problem_kind() == Some("task-refused") => eprintln!("task {}: {e}", task.id),
                Err(e) => return Err(e),
            }
        }
    }
}
