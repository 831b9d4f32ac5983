//! [`SlicePublisher`]: keeps the API server holding exactly the slices [`build_slices`] makes from the
//! devices and their current health, for one node and driver.
//!
//! The republish rule, checked by every round ([`SlicePublisher::sync`]):
//!
//! 1. Build the desired slices from the devices and the latest [`HealthSnapshot`], and list the node's slices
//!    of this driver ([`SliceStore::list`]).
//! 2. Nothing written yet by this publisher (start-up): when the listed slices have the desired names and the
//!    same content up to what the API server may rewrite ([`normalized_spec`]: canonical quantities, taint
//!    times, the pool generation), adopt them ([`PublishOutcome::Adopted`]): no write, so a restart does not
//!    bump the generation.
//! 3. Otherwise, when the desired slices equal the last ones written and the listed slices are exactly the
//!    ones written (same names and `resourceVersion`s: nobody else changed or deleted them), do nothing
//!    ([`PublishOutcome::Unchanged`]).
//! 4. Else republish at generation = highest generation seen (listed or written) + 1, on every slice of the
//!    pool: replace the slices that exist (guarded by their `resourceVersion`), create the missing ones, then
//!    delete the listed slices that are no longer desired. A failed write ends the round with an error; the
//!    next round starts again from 1 and bumps the generation again, so consumers never mix generations.
//!
//! Gate `PassthroughSupport`: with [`SlicePublisher::with_passthrough`], the GPUs on that channel (wished
//! for passthrough, or bound to `vfio-pci`: [`crate::vfio_switch::controller::passthrough_gpus`]) are
//! built without their regular devices (`gpu-<minor>`, `vgpu-<minor>`, MIG): each is published only as its
//! `gpu-vfio-<index>` device ([`visible_devices`]), so the scheduler cannot hand the GPU to a container
//! claim while it is (or is about to be) a VM's. [`SlicePublisher::run`] waits for the channel's first
//! value (the switch controller's first pass) before its first round, at most [`PASSTHROUGH_FIRST_WAIT`]
//! (the PhysicalGPU API may be down): a start-up does not publish a passthrough GPU's regular devices for
//! the moment before that pass.
//!
//! Rounds run ([`SlicePublisher::run`]) at start, after health or passthrough changes (batched: after a
//! change the publisher waits [`SlicePublisher::with_batch`] (default 1 s) so a burst of events gives one
//! republish),
//! every resync period ([`SlicePublisher::with_resync`], default 60 s: repairs slices deleted or changed by
//! someone else), and after a failed round with exponential backoff (500 ms doubling to 30 s). Slices stay
//! when the publisher stops: the devices are still there and prepared claims still use them.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    fmt,
    future::Future,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;
use vgpu_core::discovery::PciAddress;

use super::{SliceConfig, SliceError, build_slices, normalized_spec, store::SliceStore};
use crate::{devices::AllocatableDevices, health::HealthSnapshot};
use vgpu_core::dra::DeviceType;

/// How long [`SlicePublisher::run`] waits for the first passthrough set before publishing without it.
pub const PASSTHROUGH_FIRST_WAIT: Duration = Duration::from_secs(30);

/// The GPUs of this node published only as their VFIO device (module docs), by PCI address.
pub type PassthroughGpus = BTreeSet<PciAddress>;

/// `devices` without the regular devices of the GPUs in `passthrough`: only their `vfio` devices stay (a
/// device whose bus id does not parse is kept).
pub fn visible_devices<'a>(
    devices: &'a AllocatableDevices,
    passthrough: &PassthroughGpus,
) -> Cow<'a, AllocatableDevices> {
    let hidden = |d: &crate::devices::AllocatableDevice| {
        d.kind != DeviceType::Vfio
            && d.gpu.bus_id.parse::<PciAddress>().is_ok_and(|a| passthrough.contains(&a))
    };
    if !devices.iter().any(hidden) {
        return Cow::Borrowed(devices);
    }
    let mut visible = devices.clone();
    visible.remove_where(hidden);
    Cow::Owned(visible)
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The API already held the desired slices, as this publisher wrote them.
    Unchanged,
    /// Start-up found the desired slices already published (by an earlier run) and took them over.
    Adopted {
        /// Their pool generation.
        generation: i64,
    },
    /// The pool was (re)published.
    Published {
        /// The new pool generation.
        generation: i64,
        /// Slices created.
        created: usize,
        /// Slices replaced.
        replaced: usize,
        /// Slices deleted.
        deleted: usize,
    },
}

/// The publisher's progress, on a watch channel ([`SlicePublisher::status`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublisherStatus {
    /// Rounds finished (successful or not).
    pub rounds: u64,
    /// The pool generation the API holds from this publisher (0 before the first success).
    pub generation: i64,
    /// The last round's error, cleared by a successful round.
    pub last_error: Option<String>,
}

#[derive(Debug, Clone)]
struct Written {
    desired: Vec<ResourceSlice>,
    versions: BTreeMap<String, Option<String>>,
    generation: i64,
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Publishes this node's ResourceSlices through a [`SliceStore`] (module docs: the republish rule).
pub struct SlicePublisher<S> {
    store: S,
    config: SliceConfig,
    devices: Arc<AllocatableDevices>,
    health: watch::Receiver<HealthSnapshot>,
    passthrough: Option<watch::Receiver<PassthroughGpus>>,
    batch: Duration,
    resync: Duration,
    written: Option<Written>,
    status: watch::Sender<PublisherStatus>,
}

impl<S> fmt::Debug for SlicePublisher<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlicePublisher")
            .field("config", &self.config)
            .field("devices", &self.devices.len())
            .field("batch", &self.batch)
            .field("resync", &self.resync)
            .field("generation", &self.written.as_ref().map(|w| w.generation))
            .finish_non_exhaustive()
    }
}

impl<S: SliceStore> SlicePublisher<S> {
    /// A publisher of `devices` with the health `health` carries (use a receiver of
    /// [`HealthSnapshot::unmonitored_default`] when the health gate is off).
    pub fn new(
        store: S,
        config: SliceConfig,
        devices: Arc<AllocatableDevices>,
        health: watch::Receiver<HealthSnapshot>,
    ) -> Self {
        let (status, _) = watch::channel(PublisherStatus::default());
        Self {
            store,
            config,
            devices,
            health,
            passthrough: None,
            batch: Duration::from_secs(1),
            resync: Duration::from_secs(60),
            written: None,
            status,
        }
    }

    /// Publishes the GPUs `passthrough` carries only as their VFIO devices, republishing when it changes
    /// (module docs; gate `PassthroughSupport`).
    #[must_use]
    pub fn with_passthrough(mut self, passthrough: watch::Receiver<PassthroughGpus>) -> Self {
        self.passthrough = Some(passthrough);
        self
    }

    /// How long to gather health changes before republishing (default 1 s).
    pub fn with_batch(mut self, batch: Duration) -> Self {
        self.batch = batch;
        self
    }

    /// How often to check the API even without changes (default 60 s).
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// A receiver of the publisher's progress (tests and readiness wait on it instead of sleeping).
    pub fn status(&self) -> watch::Receiver<PublisherStatus> {
        self.status.subscribe()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One round of the republish rule (module docs).
    pub async fn sync(&mut self) -> Result<PublishOutcome, SliceError> {
        let result = self.sync_inner().await;
        self.status.send_modify(|status| {
            status.rounds += 1;
            match &result {
                Ok(_) => {
                    status.last_error = None;
                    status.generation = self.written.as_ref().map_or(0, |w| w.generation);
                }
                Err(error) => status.last_error = Some(error.to_string()),
            }
        });
        result
    }

    async fn sync_inner(&mut self) -> Result<PublishOutcome, SliceError> {
        let snapshot = self.health.borrow_and_update().clone();
        let passthrough =
            self.passthrough.as_mut().map(|p| p.borrow_and_update().clone()).unwrap_or_default();
        let devices = visible_devices(&self.devices, &passthrough);
        let desired = build_slices(&self.config, &devices, &snapshot, 0)?;
        let existing = self.store.list().await?;
        let listed: BTreeMap<String, Option<String>> =
            existing.iter().map(|s| (name_of(s), s.metadata.resource_version.clone())).collect();
        let highest = existing.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
        match &self.written {
            Some(written) if written.desired == desired && written.versions == listed => {
                return Ok(PublishOutcome::Unchanged);
            }
            None if same_content(&existing, &desired) => {
                self.written = Some(Written { desired, versions: listed, generation: highest });
                return Ok(PublishOutcome::Adopted { generation: highest });
            }
            _ => {}
        }
        let generation = highest.max(self.written.as_ref().map_or(0, |w| w.generation)) + 1;
        let by_name: BTreeMap<String, &ResourceSlice> = existing.iter().map(|s| (name_of(s), s)).collect();
        let mut versions = BTreeMap::new();
        let (mut created, mut replaced, mut deleted) = (0, 0, 0);
        for slice in &desired {
            let mut slice = slice.clone();
            slice.spec.pool.generation = generation;
            let name = name_of(&slice);
            let stored = match by_name.get(&name) {
                Some(old) => {
                    slice.metadata.resource_version = old.metadata.resource_version.clone();
                    replaced += 1;
                    self.store.replace(&slice).await?
                }
                None => {
                    created += 1;
                    self.store.create(&slice).await?
                }
            };
            versions.insert(name, stored.metadata.resource_version);
        }
        for name in by_name.keys().filter(|name| !versions.contains_key(*name)) {
            self.store.delete(name).await?;
            deleted += 1;
        }
        tracing::info!(
            node = %self.config.node_name,
            driver = %self.config.driver,
            generation,
            created,
            replaced,
            deleted,
            "published ResourceSlices"
        );
        self.written = Some(Written { desired, versions, generation });
        Ok(PublishOutcome::Published { generation, created, replaced, deleted })
    }

    /// Runs rounds until `shutdown` resolves (module docs: when rounds run).
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        let mut retry = RETRY_MIN;
        let mut health_open = true;
        let mut passthrough_open = self.passthrough.is_some();
        if let Some(passthrough) = self.passthrough.as_mut()
            && !passthrough.has_changed().unwrap_or(true)
        {
            tokio::select! {
                () = &mut shutdown => return,
                _ = passthrough.changed() => {}
                () = tokio::time::sleep(PASSTHROUGH_FIRST_WAIT) => {
                    tracing::warn!(waited = ?PASSTHROUGH_FIRST_WAIT, "no passthrough GPU set from the vfio-switch controller yet; publishing without it");
                }
            }
        }
        loop {
            let wait = match self.sync().await {
                Ok(outcome) => {
                    tracing::debug!(?outcome, "ResourceSlice round");
                    retry = RETRY_MIN;
                    self.resync
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?retry, "publishing ResourceSlices failed");
                    let wait = retry;
                    retry = (retry * 2).min(RETRY_MAX);
                    wait
                }
            };
            let passthrough = &mut self.passthrough;
            let passthrough_changed = async move {
                match passthrough.as_mut() {
                    Some(p) => p.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                changed = self.health.changed(), if health_open => {
                    if changed.is_err() {
                        // The monitor is gone; its last snapshot stays in force.
                        health_open = false;
                        continue;
                    }
                }
                open = passthrough_changed, if passthrough_open => {
                    if !open {
                        // The switch controller is gone; its last set stays in force.
                        passthrough_open = false;
                        continue;
                    }
                }
                () = tokio::time::sleep(wait) => continue,
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.batch) => {}
            }
        }
    }

    /// Runs [`SlicePublisher::run`] on a task.
    pub fn spawn(self, shutdown: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }
}

fn name_of(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

/// Same names, one generation, and equal normalized specs and owners.
fn same_content(existing: &[ResourceSlice], desired: &[ResourceSlice]) -> bool {
    if existing.len() != desired.len() {
        return false;
    }
    let generations: std::collections::BTreeSet<i64> =
        existing.iter().map(|s| s.spec.pool.generation).collect();
    if generations.len() > 1 {
        return false;
    }
    let by_name: BTreeMap<String, &ResourceSlice> = existing.iter().map(|s| (name_of(s), s)).collect();
    desired.iter().all(|want| {
        by_name.get(&name_of(want)).is_some_and(|have| {
            normalized_spec(&have.spec) == normalized_spec(&want.spec)
                && have.metadata.owner_references == want.metadata.owner_references
        })
    })
}
