//! The record of the latest demo run a database keeps (`meta` key `demo.run`): what the
//! demo resumes, and the simulated provider's settings that `settle run` and `settle serve
//! --scenario` take up on the same database.

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use settle_builtin::ProviderSettings;
use settle_store::{AnyStore, Store};

/// Where the record lives.
pub(crate) const META_KEY: &str = "demo.run";

/// One demo run, stored in the database so an interrupted run can be resumed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DemoRun {
    pub(crate) run: u32,
    pub(crate) servers: u32,
    pub(crate) provider: ProviderSettings,
    pub(crate) done: bool,
}

impl DemoRun {
    pub(crate) fn key(&self, i: u32) -> String {
        format!("r{}-srv-{i:05}", self.run)
    }
    pub(crate) fn prefix(&self) -> String {
        format!("r{}-srv-", self.run)
    }
}

/// The latest demo run, if any.
pub(crate) async fn stored_run(store: &AnyStore) -> anyhow::Result<Option<DemoRun>> {
    match store.meta_get(META_KEY).await? {
        Some(text) => Ok(Some(serde_json::from_str(&text).context("stored demo settings are unreadable")?)),
        None => Ok(None),
    }
}

/// The simulated provider settings of the latest demo run, if any (for `settle run`).
pub async fn stored_settings(store: &AnyStore) -> anyhow::Result<Option<ProviderSettings>> {
    Ok(stored_run(store).await?.map(|r| r.provider))
}
