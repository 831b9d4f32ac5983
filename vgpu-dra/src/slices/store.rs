//! The seam between the [`SlicePublisher`](super::publisher::SlicePublisher) and the API server: [`SliceStore`], with
//! [`KubeSliceStore`] (a `kube::Client`) and [`MemorySliceStore`] (in memory, with failure injection).
//!
//! Requests of [`KubeSliceStore`] (cluster-scoped `resource.k8s.io/v1` `resourceslices`):
//!
//! | call | request |
//! |---|---|
//! | [`SliceStore::list`] | `GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>` (then only pool `<node>` is kept) |
//! | [`SliceStore::create`] | `POST /apis/resource.k8s.io/v1/resourceslices` |
//! | [`SliceStore::replace`] | `PUT /apis/resource.k8s.io/v1/resourceslices/<name>` carrying the `resourceVersion` read by `list` (a conflict fails the round; the next one re-lists) |
//! | [`SliceStore::delete`] | `DELETE /apis/resource.k8s.io/v1/resourceslices/<name>` (404 counts as done) |

use std::{
    collections::BTreeMap,
    fmt,
    future::Future,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::SliceError;

/// What the publisher needs from the API server: the slices of one node and driver, and writes to them.
pub trait SliceStore: Send + Sync + 'static {
    /// The slices of this node's pool and driver.
    fn list(&self) -> impl Future<Output = Result<Vec<ResourceSlice>, SliceError>> + Send;
    /// Creates a slice; returns it as stored.
    fn create(&self, slice: &ResourceSlice)
    -> impl Future<Output = Result<ResourceSlice, SliceError>> + Send;
    /// Replaces a slice (its `metadata.resourceVersion` guards the write); returns it as stored.
    fn replace(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, SliceError>> + Send;
    /// Deletes a slice by name; a missing slice is not an error.
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), SliceError>> + Send;
}

fn slice_name(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

// === impl KubeSliceStore ===

/// [`SliceStore`] over a `kube::Client`.
#[derive(Clone)]
pub struct KubeSliceStore {
    api: Api<ResourceSlice>,
    node: String,
    driver: String,
}

impl fmt::Debug for KubeSliceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeSliceStore")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl KubeSliceStore {
    /// The slices of `node` and `driver`.
    pub fn new(client: kube::Client, node: &str, driver: &str) -> Self {
        Self { api: Api::all(client), node: node.to_owned(), driver: driver.to_owned() }
    }
}

fn api_error(action: &'static str, name: &str) -> impl FnOnce(kube::Error) -> SliceError {
    let name = name.to_owned();
    move |source| SliceError::Api { action, name, source: Box::new(source) }
}

impl SliceStore for KubeSliceStore {
    async fn list(&self) -> Result<Vec<ResourceSlice>, SliceError> {
        let params =
            ListParams::default().fields(&format!("spec.nodeName={},spec.driver={}", self.node, self.driver));
        let list = self.api.list(&params).await.map_err(api_error("list", &format!("pool {}", self.node)))?;
        Ok(list
            .items
            .into_iter()
            .filter(|s| s.spec.pool.name == self.node && s.spec.driver == self.driver)
            .collect())
    }

    async fn create(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceError> {
        self.api.create(&PostParams::default(), slice).await.map_err(api_error("create", &slice_name(slice)))
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceError> {
        let name = slice_name(slice);
        self.api.replace(&name, &PostParams::default(), slice).await.map_err(api_error("replace", &name))
    }

    async fn delete(&self, name: &str) -> Result<(), SliceError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(api_error("delete", name)(e)),
        }
    }
}

// === impl MemorySliceStore ===

#[derive(Debug, Default)]
struct MemoryState {
    slices: BTreeMap<String, ResourceSlice>,
    version: u64,
    writes: u64,
    fail_writes: u32,
}

/// A thread-safe in-memory [`SliceStore`] (one node's pool) for tests, with failure injection. Clones share
/// the same state. It keeps `resourceVersion` like the API server: every write bumps it, and a replace
/// carrying an old one is a conflict.
#[derive(Debug, Clone, Default)]
pub struct MemorySliceStore {
    state: Arc<Mutex<MemoryState>>,
}

impl MemorySliceStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stored slices, by name.
    pub fn slices(&self) -> BTreeMap<String, ResourceSlice> {
        self.lock().slices.clone()
    }

    /// Creates, replaces and deletes done so far (successful ones).
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// Makes the next `n` writes fail.
    pub fn fail_next_writes(&self, n: u32) {
        self.lock().fail_writes = n;
    }

    /// Stores a slice as another writer would (bumps its `resourceVersion`; not counted in [`Self::writes`]).
    pub fn put_external(&self, slice: ResourceSlice) {
        let mut state = self.lock();
        state.version += 1;
        let mut slice = slice;
        slice.metadata.resource_version = Some(state.version.to_string());
        state.slices.insert(slice_name(&slice), slice);
    }

    /// Removes a slice as another writer would.
    pub fn delete_external(&self, name: &str) {
        self.lock().slices.remove(name);
    }

    fn write(&self, action: &'static str, name: &str) -> Result<MutexGuard<'_, MemoryState>, SliceError> {
        let mut state = self.lock();
        if state.fail_writes > 0 {
            state.fail_writes -= 1;
            return Err(SliceError::Store {
                action,
                name: name.to_owned(),
                message: "injected failure".to_owned(),
            });
        }
        Ok(state)
    }

    fn store(state: &mut MemoryState, slice: &ResourceSlice) -> ResourceSlice {
        state.version += 1;
        state.writes += 1;
        let mut slice = slice.clone();
        slice.metadata.resource_version = Some(state.version.to_string());
        state.slices.insert(slice_name(&slice), slice.clone());
        slice
    }
}

impl SliceStore for MemorySliceStore {
    async fn list(&self) -> Result<Vec<ResourceSlice>, SliceError> {
        Ok(self.lock().slices.values().cloned().collect())
    }

    async fn create(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceError> {
        let name = slice_name(slice);
        let mut state = self.write("create", &name)?;
        if state.slices.contains_key(&name) {
            return Err(SliceError::Store { action: "create", name, message: "already exists".to_owned() });
        }
        Ok(Self::store(&mut state, slice))
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceError> {
        let name = slice_name(slice);
        let mut state = self.write("replace", &name)?;
        let current = state.slices.get(&name).map(|s| s.metadata.resource_version.clone());
        match current {
            None => Err(SliceError::Store { action: "replace", name, message: "not found".to_owned() }),
            Some(version) if version != slice.metadata.resource_version => Err(SliceError::Store {
                action: "replace",
                name,
                message: "conflict: stale resourceVersion".to_owned(),
            }),
            Some(_) => Ok(Self::store(&mut state, slice)),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), SliceError> {
        let mut state = self.write("delete", name)?;
        if state.slices.remove(name).is_some() {
            state.writes += 1;
        }
        Ok(())
    }
}
