//! The rank table: every node's ranking inputs (free and total slots/cores/memory, what resolving a request
//! depends on, topology fitness) in one contiguous array of fixed-size rows, read without locks.
//!
//! A filter ranks thousands of candidates per call and usually allocates on one. Reading each candidate's
//! inputs from its own locked [`NodeState`](crate::node_state::NodeState) costs a mutex round trip and a few cold
//! cache lines in separate heap objects per node; here a candidate costs one 64-byte row (one cache line) in a
//! dense table. The topology fitness tables, read only for link and NUMA requests, sit in a parallel array
//! beside the rows, so a ranking without topology never loads them.
//!
//! Rows are written only by the holder of their node's lock (every change of a node's usage or decoded
//! annotations republishes its row), and read with relaxed atomics. A reader racing a writer may see a mix of
//! old and new values: that only perturbs the order in which nodes are tried, never a placement, because the
//! allocation itself runs on the locked node state. A row belongs to one node state for that state's whole
//! life ([`RowRef`]) and is recycled only after the state is dropped, so a slot still held by an in-flight call
//! after its node was deleted never writes into another node's row.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, fence};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};

use vgpu_core::alloc::{GateInputs, GpuFree, NodeFailure, ReasonCode};
use vgpu_core::model::TopologyMode;

use crate::decoded::{DecodedNode, FITNESS_LEN, ResolveKey};

/// Rows per chunk; chunks never move, so a row's address is stable while its table lives.
const CHUNK: usize = 1024;
/// A fitness entry not computed yet (fitness values are `0..=5`).
const UNKNOWN: u8 = u8::MAX;
/// `uniform_memory` of a node whose GPUs differ in memory.
const NOT_UNIFORM: u64 = u64::MAX;

const VACANT: u32 = 0;
const READY: u32 = 1;
const FAILED: u32 = 2;

/// Row id of a name the cache does not hold.
pub const NO_ROW: u32 = u32::MAX;

/// One node's ranking inputs (one cache line), written under a sequence lock: a reader sees one published
/// state, never a mix.
#[derive(Debug)]
#[repr(align(64))]
pub struct RankRow {
    /// Even: stable; odd: a write is in progress.
    seq: AtomicU32,
    /// `VACANT`, `READY`, or `FAILED + i` for `ReasonCode::ALL[i]`.
    status: AtomicU32,
    /// Memory factor (≥ 1).
    factor: AtomicU32,
    /// Schedulable GPUs (low 16 bits) and `GATES_USABLE`.
    schedulable: AtomicU32,
    /// Uniform GPU memory, or `NOT_UNIFORM`.
    uniform_memory: AtomicU64,
    /// Free slots, cores, memory (MiB), saturated at `u32::MAX`.
    avail: [AtomicU32; 3],
    /// Total slots, cores, memory (MiB), saturated at `u32::MAX`.
    totals: [AtomicU32; 3],
    /// Largest cores and memory (MiB) of a schedulable GPU.
    max_cores: AtomicU32,
    max_memory: AtomicU32,
}

/// `schedulable` flag: the row's gate inputs are exact (nothing saturated) and the node passes the node checks
/// a request without memory policy meets (`deviceSplit > 0`, `memoryFactor > 0`).
const GATES_USABLE: u32 = 1 << 16;
/// `schedulable` flag: the GPU lane holds every GPU of the inventory (bits `LANE_LEN_SHIFT..`: how many).
const LANE_USABLE: u32 = 1 << 17;
const LANE_LEN_SHIFT: u32 = 20;

/// GPUs a row's lane holds; a node with more is left to its lock.
pub const LANE_GPUS: usize = 8;

/// A GPU packed into one word: bit 0 healthy, 1 MIG, 2 a free slot, 3 NUMA known, 4–7 NUMA node, 8–23 free
/// cores, 24–43 free memory (MiB), 44–63 memory (MiB). `None` when a value does not fit.
fn pack(g: &GpuFree) -> Option<u64> {
    let numa = match g.numa {
        None => 0,
        Some(n) if n < 16 => 0x8 | u64::from(n) << 4,
        Some(_) => return None,
    };
    if g.free_cores > 0xffff || g.free_memory_mib >= 1 << 20 || g.memory_mib >= 1 << 20 {
        return None;
    }
    Some(
        u64::from(g.healthy)
            | u64::from(g.mig) << 1
            | u64::from(g.has_slot) << 2
            | numa
            | g.free_cores << 8
            | g.free_memory_mib << 24
            | g.memory_mib << 44,
    )
}

fn unpack(w: u64) -> GpuFree {
    GpuFree {
        healthy: w & 1 != 0,
        mig: w & 2 != 0,
        has_slot: w & 4 != 0,
        numa: (w & 8 != 0).then_some(((w >> 4) & 0xf) as u32),
        free_cores: (w >> 8) & 0xffff,
        free_memory_mib: (w >> 24) & 0xf_ffff,
        memory_mib: w >> 44,
    }
}

/// A copy of a row's GPU lane: every GPU of the node's inventory, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLane {
    packed: [u64; LANE_GPUS],
    len: usize,
}

impl GpuLane {
    /// The GPUs.
    pub fn iter(&self) -> impl Iterator<Item = GpuFree> + '_ {
        self.packed.iter().take(self.len).map(|&w| unpack(w))
    }
}

const _: () = assert!(std::mem::size_of::<RankRow>() == 64);

/// Link, then NUMA fitness per need of one node; `UNKNOWN` until first asked for.
type FitnessTable = [[AtomicU8; FITNESS_LEN]; 2];

fn unknown_fitness() -> FitnessTable {
    std::array::from_fn(|_| std::array::from_fn(|_| AtomicU8::new(UNKNOWN)))
}

/// `CHUNK` rows, their fitness tables and GPU lanes, at the same positions.
#[derive(Debug)]
struct Chunk {
    rows: Box<[RankRow]>,
    fitness: Box<[FitnessTable]>,
    /// Per row, its GPUs packed ([`pack`]), written and read under the row's sequence lock.
    gpus: Box<[[AtomicU64; LANE_GPUS]]>,
}

impl Chunk {
    fn new() -> Self {
        Self {
            rows: (0..CHUNK).map(|_| RankRow::vacant()).collect(),
            fitness: (0..CHUNK).map(|_| unknown_fitness()).collect(),
            gpus: (0..CHUNK).map(|_| std::array::from_fn(|_| AtomicU64::new(0))).collect(),
        }
    }

    fn reset(&self, i: usize) {
        if let Some(row) = self.rows.get(i) {
            row.status.store(VACANT, Relaxed);
        }
        self.reset_fitness(i);
    }

    fn reset_fitness(&self, i: usize) {
        for lane in self.fitness.get(i).into_iter().flatten() {
            for f in lane {
                f.store(UNKNOWN, Relaxed);
            }
        }
    }
}

/// A node's row, fitness table and GPU lane, as read by [`RowReader::get`].
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    row: &'a RankRow,
    fitness: &'a FitnessTable,
    gpus: &'a [AtomicU64; LANE_GPUS],
}

/// What a row says about its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowStatus {
    /// No node (deleted, or never written).
    Vacant,
    /// The node decoded; its inputs are valid.
    Ready,
    /// The node cannot take vGPU pods, for this reason.
    Failed(ReasonCode),
}

/// A copy of a row's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankInputs {
    /// Free slots, cores, memory over schedulable GPUs.
    pub avail: [u64; 3],
    /// Total slots, cores, memory over schedulable GPUs.
    pub totals: [u64; 3],
    /// What resolving a request on the node depends on.
    pub key: ResolveKey,
    /// The node's size-gate inputs, when they are exact and the node passes the node checks for a request
    /// without memory policy (`vgpu_core::alloc::size_gate` then rejects exactly as a placement attempt would).
    pub gates: Option<GateInputs>,
}

/// A row's fitness entry for a mode and need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowFitness {
    /// The mode has no fitness (anything but link and NUMA).
    NotRanked,
    /// Not computed yet: compute it on the locked node ([`RowRef::fill_fitness`]).
    Unknown,
    /// The fitness.
    Known(u8),
}

fn fitness_lane(mode: TopologyMode) -> Option<usize> {
    match mode {
        TopologyMode::Link => Some(0),
        TopologyMode::Numa => Some(1),
        _ => None,
    }
}

impl RankRow {
    fn vacant() -> Self {
        Self {
            seq: AtomicU32::new(0),
            status: AtomicU32::new(VACANT),
            factor: AtomicU32::new(1),
            schedulable: AtomicU32::new(0),
            uniform_memory: AtomicU64::new(NOT_UNIFORM),
            avail: std::array::from_fn(|_| AtomicU32::new(0)),
            totals: std::array::from_fn(|_| AtomicU32::new(0)),
            max_cores: AtomicU32::new(0),
            max_memory: AtomicU32::new(0),
        }
    }

    /// Runs `write` as one sequence-locked write (the caller is the row's only writer: it holds its node's lock).
    fn write(&self, write: impl FnOnce(&Self)) {
        let s = self.seq.load(Relaxed);
        self.seq.store(s.wrapping_add(1), Relaxed);
        fence(Release);
        write(self);
        self.seq.store(s.wrapping_add(2), Release);
    }

    /// Reads a consistent copy through the sequence lock.
    fn read<T>(&self, read: impl Fn(&Self) -> T) -> T {
        loop {
            let before = self.seq.load(Acquire);
            if before & 1 == 0 {
                let value = read(self);
                fence(Acquire);
                if self.seq.load(Relaxed) == before {
                    return value;
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl Row<'_> {
    /// The node's status.
    pub fn status(&self) -> RowStatus {
        match self.row.read(|r| r.status.load(Relaxed)) {
            READY => RowStatus::Ready,
            VACANT => RowStatus::Vacant,
            s => ReasonCode::ALL
                .get((s - FAILED) as usize)
                .map_or(RowStatus::Vacant, |c| RowStatus::Failed(*c)),
        }
    }

    /// The row's numbers (meaningful when the status is [`RowStatus::Ready`]).
    pub fn inputs(&self) -> RankInputs {
        self.row.read(Self::inputs_of)
    }

    fn inputs_of(row: &RankRow) -> RankInputs {
        let load = |a: &[AtomicU32; 3]| a.each_ref().map(|v| u64::from(v.load(Relaxed)));
        let uniform = row.uniform_memory.load(Relaxed);
        let schedulable = row.schedulable.load(Relaxed);
        let avail = load(&row.avail);
        RankInputs {
            avail,
            totals: load(&row.totals),
            key: (row.factor.load(Relaxed), (uniform != NOT_UNIFORM).then_some(uniform)),
            gates: (schedulable & GATES_USABLE != 0).then(|| GateInputs {
                schedulable: u64::from(schedulable & 0xffff),
                max_cores: u64::from(row.max_cores.load(Relaxed)),
                max_memory_mib: u64::from(row.max_memory.load(Relaxed)),
                avail,
            }),
        }
    }

    /// The row's numbers and, when it holds every GPU of the node, its GPU lane — one consistent copy.
    pub fn inputs_with_gpus(&self) -> (RankInputs, Option<GpuLane>) {
        self.row.read(|row| {
            let flags = row.schedulable.load(Relaxed);
            let lane = (flags & LANE_USABLE != 0).then(|| GpuLane {
                packed: self.gpus.each_ref().map(|w| w.load(Relaxed)),
                len: ((flags >> LANE_LEN_SHIFT) as usize).min(LANE_GPUS),
            });
            (Self::inputs_of(row), lane)
        })
    }

    /// The topology fitness of a need under a base mode.
    pub fn fitness(&self, mode: TopologyMode, need: u32) -> RowFitness {
        let Some(lane) = fitness_lane(mode) else { return RowFitness::NotRanked };
        match self.fitness[lane][(need as usize).min(FITNESS_LEN - 1)].load(Relaxed) {
            UNKNOWN => RowFitness::Unknown,
            f => RowFitness::Known(f),
        }
    }
}

#[derive(Debug, Default)]
struct Allocation {
    /// Ids handed back by dropped rows.
    free: Vec<u32>,
    /// Ids `0..next` have been handed out at least once.
    next: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The table: chunks of rows, and the ids free for reuse.
#[derive(Debug, Default)]
pub struct RankTable {
    chunks: RwLock<Vec<Arc<Chunk>>>,
    ids: Arc<Mutex<Allocation>>,
}

impl RankTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A row for a new node state, vacant until its owner publishes it.
    pub fn alloc(&self) -> RowRef {
        let id = {
            let mut ids = lock(&self.ids);
            match ids.free.pop() {
                Some(id) => id,
                None => {
                    ids.next += 1;
                    ids.next - 1
                }
            }
        };
        let index = id as usize;
        let chunk = {
            let mut chunks = self.chunks.write().unwrap_or_else(PoisonError::into_inner);
            while chunks.len() <= index / CHUNK {
                chunks.push(Arc::new(Chunk::new()));
            }
            chunks[index / CHUNK].clone()
        };
        chunk.reset(index % CHUNK);
        RowRef { chunk, id, ids: Arc::downgrade(&self.ids) }
    }

    /// A reader over the rows as they are now (new chunks added later are not seen; rows are).
    pub fn reader(&self) -> RowReader {
        RowReader { chunks: self.chunks.read().unwrap_or_else(PoisonError::into_inner).clone() }
    }
}

/// Lock-free access to rows by id.
#[derive(Debug, Clone)]
pub struct RowReader {
    chunks: Vec<Arc<Chunk>>,
}

impl RowReader {
    /// The row of an id ([`NO_ROW`] and unknown ids: `None`).
    pub fn get(&self, id: u32) -> Option<Row<'_>> {
        let index = id as usize;
        let chunk = self.chunks.get(index / CHUNK)?;
        let i = index % CHUNK;
        Some(Row { row: chunk.rows.get(i)?, fitness: chunk.fitness.get(i)?, gpus: chunk.gpus.get(i)? })
    }
}

/// A node state's own row: the only way to write it. Dropping it vacates the row and frees its id.
#[derive(Debug)]
pub struct RowRef {
    chunk: Arc<Chunk>,
    id: u32,
    ids: Weak<Mutex<Allocation>>,
}

impl RowRef {
    /// The row's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    fn index(&self) -> usize {
        self.id as usize % CHUNK
    }

    /// Publishes a node's decoded state, its size-gate inputs under its usage (free capacity included) and its
    /// GPUs (every GPU of the inventory, in order; the lane is left unused past [`LANE_GPUS`]).
    pub fn publish(
        &self,
        decoded: &Result<Arc<DecodedNode>, NodeFailure>,
        gates: &GateInputs,
        gpus: impl ExactSizeIterator<Item = GpuFree>,
    ) {
        let Some(row) = self.chunk.rows.get(self.index()) else { return };
        let Some(lane) = self.chunk.gpus.get(self.index()) else { return };
        let narrow = |v: u64| u32::try_from(v).ok();
        row.write(|row| match decoded {
            Ok(d) => {
                let (factor, uniform) = d.resolve_key();
                row.factor.store(factor, Relaxed);
                row.uniform_memory.store(uniform.unwrap_or(NOT_UNIFORM), Relaxed);
                let mut exact = true;
                let mut put = |cell: &AtomicU32, v: u64| {
                    exact &= narrow(v).is_some();
                    cell.store(narrow(v).unwrap_or(u32::MAX), Relaxed);
                };
                for (cell, v) in row.totals.iter().zip(d.totals) {
                    put(cell, v);
                }
                for (cell, v) in row.avail.iter().zip(gates.avail) {
                    put(cell, v);
                }
                put(&row.max_cores, gates.max_cores);
                put(&row.max_memory, gates.max_memory_mib);
                let checks_pass = d.config.device_split != 0 && d.config.memory_factor != 0;
                let usable = exact && checks_pass && gates.schedulable <= 0xffff;
                let schedulable = (gates.schedulable.min(0xffff)) as u32;
                let len = gpus.len();
                let mut packed = len <= LANE_GPUS;
                for (cell, g) in lane.iter().zip(gpus) {
                    match pack(&g) {
                        Some(w) => cell.store(w, Relaxed),
                        None => packed = false,
                    }
                }
                let mut flags = schedulable;
                if usable {
                    flags |= GATES_USABLE;
                    if packed {
                        flags |= LANE_USABLE | (len as u32) << LANE_LEN_SHIFT;
                    }
                }
                row.schedulable.store(flags, Relaxed);
                row.status.store(READY, Relaxed);
            }
            Err(f) => {
                let i = ReasonCode::ALL.iter().position(|c| *c == f.code).unwrap_or(0);
                // No gates or lane for a node that cannot take vGPU pods.
                row.schedulable.store(0, Relaxed);
                row.status.store(FAILED + i as u32, Relaxed);
            }
        });
    }

    /// Forgets the fitness entries (the node's topology changed).
    pub fn reset_fitness(&self) {
        self.chunk.reset_fitness(self.index());
    }

    /// Stores a node's fitness table for a mode (computed from its decoded annotations).
    pub fn fill_fitness(&self, mode: TopologyMode, table: &[u8; FITNESS_LEN]) {
        if let (Some(lane), Some(fitness)) = (fitness_lane(mode), self.chunk.fitness.get(self.index())) {
            for (cell, &f) in fitness[lane].iter().zip(table) {
                cell.store(f.min(UNKNOWN - 1), Relaxed);
            }
        }
    }
}

impl Drop for RowRef {
    fn drop(&mut self) {
        self.chunk.reset(self.index());
        if let Some(ids) = self.ids.upgrade() {
            lock(&ids).free.push(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_recycled_only_after_their_owner_is_dropped() {
        let table = RankTable::new();
        let a = table.alloc();
        let b = table.alloc();
        assert_eq!((a.id(), b.id()), (0, 1));
        a.publish(
            &Err(NodeFailure::new(ReasonCode::NodeBadVgpuConfig)),
            &GateInputs::default(),
            std::iter::empty(),
        );
        let reader = table.reader();
        assert_eq!(reader.get(0).map(|r| r.status()), Some(RowStatus::Failed(ReasonCode::NodeBadVgpuConfig)));
        assert_eq!(reader.get(1).map(|r| r.status()), Some(RowStatus::Vacant));
        assert!(reader.get(NO_ROW).is_none());
        a.fill_fitness(TopologyMode::Link, &[5; FITNESS_LEN]);
        assert_eq!(reader.get(0).map(|r| r.fitness(TopologyMode::Link, 40)), Some(RowFitness::Known(5)));
        assert_eq!(reader.get(0).map(|r| r.fitness(TopologyMode::Numa, 1)), Some(RowFitness::Unknown));
        assert_eq!(reader.get(0).map(|r| r.fitness(TopologyMode::None, 1)), Some(RowFitness::NotRanked));
        drop(a);
        assert_eq!(reader.get(0).map(|r| r.status()), Some(RowStatus::Vacant));
        let c = table.alloc();
        assert_eq!(c.id(), 0, "the freed id is reused");
        assert_eq!(reader.get(0).map(|r| r.fitness(TopologyMode::Link, 1)), Some(RowFitness::Unknown));
        // Growing past a chunk: earlier readers keep their rows, new readers see the new chunk.
        let more: Vec<RowRef> = (0..CHUNK).map(|_| table.alloc()).collect();
        assert!(more.iter().any(|r| r.id() as usize >= CHUNK));
        assert!(reader.get(CHUNK as u32).is_none());
        assert!(table.reader().get(CHUNK as u32).is_some());
        drop(b);
        drop(c);
    }

    #[test]
    fn gpus_pack_into_one_word_and_back() {
        let g = GpuFree {
            healthy: true,
            mig: false,
            has_slot: true,
            free_cores: 65_535,
            free_memory_mib: (1 << 20) - 1,
            memory_mib: 196_608,
            numa: Some(15),
        };
        assert_eq!(pack(&g).map(unpack), Some(g));
        let none = GpuFree { numa: None, healthy: false, mig: true, ..g };
        assert_eq!(pack(&none).map(unpack), Some(none));
        assert_eq!(pack(&GpuFree { numa: Some(16), ..g }), None);
        assert_eq!(pack(&GpuFree { free_cores: 65_536, ..g }), None);
        assert_eq!(pack(&GpuFree { memory_mib: 1 << 20, ..g }), None);
    }
}
