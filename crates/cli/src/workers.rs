//! Worker processes for `--instances K`: K `settle run` processes on one PostgreSQL
//! database, started and supervised by the driving command (`demo`, `bench`); and the
//! same for `settle demo --agents K` (K `settle agent` processes).
//!
//! Each worker's stdin is a pipe from the driver; a worker started with
//! `--until-stdin-closes` stops gracefully when the pipe closes, so workers never outlive
//! their driver, even when the driver is killed. A worker that dies (a crash, `kill -9`) is
//! reported and restarted: its leases expire and the other workers, or its successor, take
//! its entities over.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

struct Worker {
    index: usize,
    child: Child,
}

/// The running workers of one driver.
pub struct Workers {
    /// What they are called in messages (`worker`, `agent`).
    label: &'static str,
    /// The `settle` arguments each is started with.
    args: Vec<String>,
    workers: Vec<Worker>,
    /// Workers restarted after they died.
    pub restarts: u64,
}

/// Refuses `--instances` on a database only one process may drive.
pub fn check_db(db: &str, instances: usize) -> anyhow::Result<()> {
    if instances > 0 && !settle_store::is_postgres_url(db) {
        bail!(
            "--instances needs a PostgreSQL database (--db postgres://...): a SQLite file is driven by one engine \
             process at a time"
        );
    }
    Ok(())
}

impl Workers {
    /// Starts `k` workers (`settle run`) on `db`.
    pub fn start(db: &str, k: usize) -> anyhow::Result<Self> {
        let args = ["run", "--until-stdin-closes", "--db", db].map(String::from).to_vec();
        Self::start_with("worker", args, k)
    }

    /// Starts `k` processes of `settle <args>` (which must stop when stdin closes); `{i}`
    /// in an argument is replaced by the process's number.
    pub fn start_with(label: &'static str, args: Vec<String>, k: usize) -> anyhow::Result<Self> {
        let mut w = Workers { label, args, workers: Vec::with_capacity(k), restarts: 0 };
        for index in 1..=k {
            let child = w.spawn(index)?;
            w.workers.push(Worker { index, child });
        }
        Ok(w)
    }

    fn spawn(&self, index: usize) -> anyhow::Result<Child> {
        let exe = std::env::current_exe().context("cannot find the settle executable")?;
        let label = self.label;
        let args: Vec<String> = self.args.iter().map(|a| a.replace("{i}", &index.to_string())).collect();
        let child = Command::new(exe)
            .args(&args)
            .env_remove("SETTLE_DB")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {label} process {index}"))?;
        crate::print::stderr_line(format_args!("{label} {index} started (pid {})", child.id().unwrap_or(0)));
        Ok(child)
    }

    /// Restarts workers that have exited; call now and then.
    pub fn supervise(&mut self) -> anyhow::Result<()> {
        for i in 0..self.workers.len() {
            let exited = self.workers[i].child.try_wait().context("cannot check a child process")?;
            if let Some(status) = exited {
                let index = self.workers[i].index;
                eprintln!("{} {index} exited ({status}); restarting it", self.label);
                self.workers[i].child = self.spawn(index)?;
                self.restarts += 1;
            }
        }
        Ok(())
    }

    /// Asks every worker to stop (closes their stdin) and waits for them, at most `grace`
    /// each before killing it.
    pub async fn stop(mut self, grace: Duration) {
        for w in &mut self.workers {
            drop(w.child.stdin.take());
        }
        for w in &mut self.workers {
            match tokio::time::timeout(grace, w.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    eprintln!("{} {} did not stop within {grace:?}; killing it", self.label, w.index);
                    let _ = w.child.kill().await;
                }
            }
        }
    }
}

/// A `settle serve` child process (for `demo --agents` and `bench agents`), stopped by
/// closing its stdin.
pub struct Server {
    child: tokio::process::Child,
    /// Its base URL.
    pub url: String,
}

impl Server {
    /// Starts `settle serve` on `db` with `extra` arguments, on a free loopback port.
    pub async fn start(db: &str, extra: &[&str]) -> anyhow::Result<Server> {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe().context("cannot find the settle executable")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["serve", "--until-stdin-closes", "--listen", "127.0.0.1:0", "--db", db])
            .args(extra)
            .env_remove("SETTLE_DB")
            .env_remove("SETTLE_TOKENS")
            // Transient provider failures are expected here: keep the server's log to errors.
            .env("SETTLE_LOG", std::env::var("SETTLE_LOG").unwrap_or_else(|_| "error".into()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start `settle serve`")?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let url = loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .context("`settle serve` did not say where it listens within 60 s")??;
            let Some(line) = line else { bail!("`settle serve` exited before listening") };
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap_or_default().to_string();
            }
        };
        // Keep draining its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        crate::print::stderr_line(format_args!("server started (pid {}) at {url}", child.id().unwrap_or(0)));
        Ok(Server { child, url })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Fails if the server exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the server exited ({status})");
        }
        Ok(())
    }

    /// Stops it gracefully (closes its stdin), at most 30 s.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!("the server stopped with {status}");
                }
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("the server did not stop within 30 s; killed");
            }
        }
        Ok(())
    }
}
