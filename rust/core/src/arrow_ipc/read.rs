//! An IPC table read into one allocation, start to end: the file opened once (its
//! metadata, the plan, any frame headers and the batch read of the buffers all go through
//! the one handle), the route the buffers take, the allocation's placement, the reads,
//! zeroing and copies, the arrays built after the read, and the host fallback of GPU
//! decoding.
//!
//! The route ([`Route`]): an uncompressed plan reads every buffer straight into its place
//! ([`ReadPlan::layout`]); a compressed one decodes on the host (into the table's memory
//! when that is host memory, else moved onto the GPU in one copy), unless the caller has a
//! GPU decoder (nvCOMP, which kvikpy reaches from Python) and the table goes to a GPU: then
//! the buffers are read as they are onto that GPU in one batch read, what the GPU cannot
//! decode is decoded on the host and copied into place, and the rest is handed back as
//! [`GpuWork`] for the decoder, which [`GpuWork::decode_on_host`] does instead should the
//! decoder be missing or fail (from the bytes already read: the file is not read again).

use std::path::{Path, PathBuf};

use super::built::{build, BuiltArrays};
use super::compression::{decode_to_host, Decoded};
use super::file::{IpcFile, SourceReader};
use super::gpu_decode::{decode_pieces_on_host, plan_gpu_decode, GpuDecodePlan, Piece, Placed};
use super::plan::{ReadPlan, ALIGN};
use crate::allocation::{Allocation, Placement};
use crate::batch_plan::{layout_aligned, plan_ranges_placed};
use crate::cuda::{copy_device_to_host, copy_host_to_device, zero_device};
use crate::error::{Error, Result};
use crate::settings::Settings;

/// What to read, and where.
#[derive(Debug, Clone)]
pub struct TableRequest {
    /// A local path, or a URL kvikpy reads.
    pub path: PathBuf,
    /// The columns to read, by name, in the order wanted (all when `None`).
    pub columns: Option<Vec<String>>,
    /// The record batches to read (all when `None`; a negative index counts from the
    /// end).
    pub batches: Option<Vec<i64>>,
    /// Where the table goes.
    pub placement: Placement,
    /// Whether the caller has a GPU decoder for compressed buffers: a GPU table's
    /// compressed buffers are then left to it ([`GpuWork`]).
    pub gpu_decoder: bool,
}

/// How a read fills its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Nothing compressed: every buffer read straight into its place.
    Plain,
    /// Compressed buffers decoded on the host.
    HostDecode,
    /// Compressed buffers read as they are onto the GPU, for its decoder.
    GpuDecode,
}

/// The route of `plan` read to `placement`.
fn route(plan: &ReadPlan, placement: Placement, gpu_decoder: bool) -> Route {
    if !plan.is_compressed() {
        return Route::Plain;
    }
    // Dictionaries extended by deltas are joined from the decoded bytes when the table is
    // made, before a GPU decoder could run: such a read decodes on the host.
    match placement {
        Placement::Device(_) if gpu_decoder && plan.built.is_empty() => Route::GpuDecode,
        _ => Route::HostDecode,
    }
}

/// An IPC table in one allocation: the plan, where each of its ranges lies, and the
/// arrays built after the read.
pub struct Table {
    /// What was read and how its arrays lie over the ranges.
    pub plan: ReadPlan,
    /// The memory holding every range.
    pub memory: Allocation,
    /// Each range's offset in `memory`.
    pub offsets: Vec<usize>,
    /// Each range's size in `memory` (decoded, for compressed ranges).
    pub sizes: Vec<u64>,
    /// The arrays built after the read (dictionaries extended by deltas).
    pub built: BuiltArrays,
}

impl Table {
    /// The table of `plan` over `memory`, its ranges at `offsets`, `sizes` long; its
    /// arrays built after the read are built here (copied from the GPU and back for a GPU
    /// table).
    fn new(
        plan: ReadPlan,
        memory: Allocation,
        offsets: Vec<usize>,
        sizes: Vec<u64>,
    ) -> Result<Self> {
        let addresses = addresses(memory.base(), &offsets);
        let built = build(&plan, &addresses, &sizes, memory.placement().ordinal())?;
        Ok(Self {
            plan,
            memory,
            offsets,
            sizes,
            built,
        })
    }

    /// Each range's address.
    pub fn addresses(&self) -> Vec<u64> {
        addresses(self.memory.base(), &self.offsets)
    }
}

/// Each range's address in memory at `base`, the ranges at `offsets`.
pub fn addresses(base: u64, offsets: &[usize]) -> Vec<u64> {
    offsets.iter().map(|&o| base + o as u64).collect()
}

/// What a GPU decoder has left to do after [`read_table`]: ZSTD frames, LZ4 blocks and
/// copies from the buffers as read (kept here, on the table's GPU) into the table.
pub struct GpuWork {
    /// The buffers as read from the file.
    source: Allocation,
    /// Each range's offset in `source`.
    sources: Vec<usize>,
    pieces: Vec<Piece>,
    /// Each range's name in messages.
    labels: Vec<String>,
}

impl GpuWork {
    /// The pieces at their addresses: sources in the buffers as read (alive as long as
    /// this work), destinations in `table`'s memory.
    pub fn pieces(&self, table: &Table) -> Vec<Placed> {
        let (source, memory) = (self.source.base(), table.memory.base());
        self.pieces
            .iter()
            .map(|p| {
                let src = source + self.sources[p.range] as u64;
                p.at(src, memory + table.offsets[p.range] as u64)
            })
            .collect()
    }

    /// Each range's name in messages: its record batch, column and buffer.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Do the GPU decoder's work on the host instead, into `table` (the fallback where
    /// the decoder is missing or fails): the buffers as read are copied to the host, each
    /// piece decoded into its place (a malformed buffer is named), and the table's bytes
    /// copied back, whatever the decoder had written there replaced. Anything queued on
    /// the table's memory must have finished.
    pub fn decode_on_host(mut self, table: &mut Table) -> Result<()> {
        let source = host_copy(&mut self.source)?;
        let mut out = host_copy(&mut table.memory)?;
        decode_pieces_on_host(
            &self.pieces,
            &source,
            &self.sources,
            &mut out,
            &table.offsets,
            &self.labels,
        )?;
        write_at(&mut table.memory, 0, &out)
    }
}

/// The file at `path` opened, its metadata read and checked, and the plan of the chosen
/// `columns` (names; all when `None`) of the chosen record `batches`; the open file comes
/// along for the reads that follow.
fn open_plan(
    settings: &Settings,
    path: &Path,
    columns: Option<&[String]>,
    batches: Option<&[i64]>,
) -> Result<(SourceReader, ReadPlan)> {
    let reader = SourceReader::open(path, settings)?;
    let file = IpcFile::read(&reader)?;
    let columns = columns.map(|c| file.column_indices(c)).transpose()?;
    let plan = file.plan(columns.as_deref(), batches)?;
    Ok((reader, plan))
}

/// Read the table `request` asks for: the file opened once, the route chosen from its
/// plan, the table's memory allocated at the request's placement and filled. With a GPU
/// decoder, a GPU table's compressed buffers may be left as [`GpuWork`] (the table's
/// bytes are complete only once it is done); otherwise the table is complete.
pub fn read_table(settings: &Settings, request: TableRequest) -> Result<(Table, Option<GpuWork>)> {
    let TableRequest {
        path,
        columns,
        batches,
        placement,
        gpu_decoder,
    } = request;
    let (reader, plan) = open_plan(settings, &path, columns.as_deref(), batches.as_deref())?;
    match route(&plan, placement, gpu_decoder) {
        Route::GpuDecode => read_for_gpu_decoder(settings, reader, plan, placement),
        Route::Plain => Ok((read_plain(settings, reader, plan, placement)?, None)),
        Route::HostDecode => Ok((decode_on_host(&reader, plan, placement)?, None)),
    }
}

/// An uncompressed `plan`'s table: its buffers read straight into their places in one
/// allocation ([`ReadPlan::layout`]), neighbouring buffers as one read where they follow
/// each other both in the file and in the table.
fn read_plain(
    settings: &Settings,
    reader: SourceReader,
    plan: ReadPlan,
    placement: Placement,
) -> Result<Table> {
    let sizes = plan.read_sizes();
    let layout = plan.layout(&sizes, ALIGN)?;
    let (reads, starts) = layout.reads(&plan.ranges, &sizes);
    let memory = read_into(settings, reader, &reads, &starts, layout.total, placement)?;
    Table::new(plan, memory, layout.offsets, sizes)
}

/// `ranges` of the file behind `reader`, range `i` at `starts[i]`, read in one batch into
/// new memory of `total` bytes at `placement`.
fn read_into(
    settings: &Settings,
    reader: SourceReader,
    ranges: &[(u64, u64)],
    starts: &[usize],
    total: usize,
    placement: Placement,
) -> Result<Allocation> {
    let (handle, file_size) = reader.into_handle();
    let batch = plan_ranges_placed(handle, file_size, ranges, starts, total)?;
    let memory = Allocation::new(placement, total, false)?;
    batch.read(settings, memory.span(), None)?;
    Ok(memory)
}

/// A compressed `plan`'s table, its buffers decoded on the host: into the table's memory
/// for a host table, else moved onto the GPU in one copy.
fn decode_on_host(reader: &SourceReader, plan: ReadPlan, placement: Placement) -> Result<Table> {
    let Decoded {
        memory,
        offsets,
        sizes,
    } = decode_to_host(reader, &plan, ALIGN)?;
    let memory = match placement {
        Placement::Host => memory,
        Placement::Device(_) => {
            let mut host = memory;
            Allocation::with_bytes(placement, host_bytes(&mut host)?)?
        }
    };
    let sizes = sizes.iter().map(|&s| s as u64).collect();
    Table::new(plan, memory, offsets, sizes)
}

/// A compressed `plan`'s table on GPU `ordinal` with its compressed buffers left for a
/// GPU decoder: the buffers read as they are in one batch read onto the GPU, the table's
/// memory sized by the checked decode plan and zeroed (the decoders write only the
/// buffers, and the gaps between them are zero as on the other routes), the buffers the
/// GPU cannot decode decoded on the host and copied into place. (At `placement`: the
/// engine's tests run this route in host memory.)
fn read_for_gpu_decoder(
    settings: &Settings,
    reader: SourceReader,
    plan: ReadPlan,
    placement: Placement,
) -> Result<(Table, Option<GpuWork>)> {
    let GpuDecodePlan {
        sizes,
        offsets,
        total,
        pieces,
        host,
        labels,
    } = plan_gpu_decode(&reader, &plan, ALIGN)?;
    let lens = plan
        .ranges
        .iter()
        .map(|&(_, len)| usize::try_from(len))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| Error::InvalidArgument("a buffer is too large".into()))?;
    let (sources, read_total) = layout_aligned(&lens, ALIGN)?;
    let source = read_into(
        settings,
        reader,
        &plan.ranges,
        &sources,
        read_total,
        placement,
    )?;
    let mut memory = Allocation::new(placement, total, false)?;
    zero(&mut memory)?;
    for (range, bytes) in &host {
        // The decode plan placed range `range` (its decoded size, `bytes.len()`) at
        // `offsets[range]` inside the table's `total` bytes.
        write_at(&mut memory, offsets[*range], bytes)?;
    }
    let table = Table::new(plan, memory, offsets, sizes)?;
    let work = (!pieces.is_empty()).then_some(GpuWork {
        source,
        sources,
        pieces,
        labels,
    });
    Ok((table, work))
}

/// A read's GPU decode plan with file offsets for its sources and allocation offsets for
/// its destinations: what [`read_table`] hands a GPU decoder, for tests that run it with a
/// host stand-in for the decoder and benchmarks that count its work.
#[derive(Debug, Clone)]
pub struct FileDecodePlan {
    /// The GPU's work, each piece read at a file offset and placed at an offset of the
    /// table's allocation.
    pub pieces: Vec<Placed>,
    /// The ranges decoded on the host: each one's offset in the allocation and bytes.
    pub host: Vec<(usize, Vec<u8>)>,
    /// The allocation's size.
    pub total: usize,
    /// Each range's name in messages.
    pub labels: Vec<String>,
}

/// The [`FileDecodePlan`] of the chosen `columns` (names; all when `None`) of the chosen
/// record `batches` (all when `None`) of the IPC file or stream at `path`.
pub fn plan_file_decode(
    settings: &Settings,
    path: &Path,
    columns: Option<&[String]>,
    batches: Option<&[i64]>,
) -> Result<FileDecodePlan> {
    let (reader, plan) = open_plan(settings, path, columns, batches)?;
    let gpu = plan_gpu_decode(&reader, &plan, ALIGN)?;
    let pieces = gpu
        .pieces
        .iter()
        .map(|p| p.at(plan.ranges[p.range].0, gpu.offsets[p.range] as u64))
        .collect();
    let host = gpu
        .host
        .into_iter()
        .map(|(r, bytes)| (gpu.offsets[r], bytes))
        .collect();
    Ok(FileDecodePlan {
        pieces,
        host,
        total: gpu.total,
        labels: gpu.labels,
    })
}

/// The bytes of host memory `memory`; an error for GPU memory.
fn host_bytes(memory: &mut Allocation) -> Result<&mut [u8]> {
    memory
        .host_bytes_mut()
        .ok_or_else(|| Error::InvalidArgument("host memory expected".into()))
}

/// A host copy of all of `memory` (GPU or host).
fn host_copy(memory: &mut Allocation) -> Result<Vec<u8>> {
    match memory.placement() {
        Placement::Host => Ok(host_bytes(memory)?.to_vec()),
        Placement::Device(ordinal) => {
            let mut bytes = vec![0u8; memory.size()];
            if !bytes.is_empty() {
                // SAFETY: `memory` holds `bytes.len()` bytes on GPU `ordinal`, alive while
                // borrowed here; `bytes` is writable host memory of that length.
                unsafe {
                    copy_device_to_host(ordinal, bytes.as_mut_ptr(), memory.base(), bytes.len())?
                };
            }
            Ok(bytes)
        }
    }
}

/// Write `bytes` into `memory` (GPU or host) at `offset`.
fn write_at(memory: &mut Allocation, offset: usize, bytes: &[u8]) -> Result<()> {
    if offset
        .checked_add(bytes.len())
        .is_none_or(|end| end > memory.size())
    {
        return Err(Error::InvalidArgument(format!(
            "{} bytes at {offset} pass the end of an allocation of {}",
            bytes.len(),
            memory.size()
        )));
    }
    match memory.placement() {
        Placement::Host => host_bytes(memory)?[offset..offset + bytes.len()].copy_from_slice(bytes),
        Placement::Device(ordinal) if !bytes.is_empty() => {
            let at = memory.base() + offset as u64;
            // SAFETY: `at..at + bytes.len()` lies inside `memory` (checked above), on GPU
            // `ordinal`, borrowed mutably here; `bytes` is live host memory of that length.
            unsafe { copy_host_to_device(ordinal, at, bytes.as_ptr(), bytes.len())? }
        }
        Placement::Device(_) => {}
    }
    Ok(())
}

/// Set all of `memory` (GPU or host) to zero.
fn zero(memory: &mut Allocation) -> Result<()> {
    match memory.placement() {
        Placement::Host => host_bytes(memory)?.fill(0),
        Placement::Device(ordinal) if memory.size() > 0 => {
            // SAFETY: `memory` holds `size()` bytes on GPU `ordinal`, borrowed mutably
            // here.
            unsafe { zero_device(ordinal, memory.base(), memory.size())? }
        }
        Placement::Device(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The routes, and the GPU route with its host fallback run in host memory (its copies
    //! are then the same bytes): from the one open file to the host decoder's table.

    use std::io::Write;

    use super::super::compression::decode_to_host;
    use super::super::gpu_decode::tests::{data, file_and_plan, Form};
    use super::super::gpu_decode::Step;
    use super::super::plan::Built;
    use super::*;

    /// Buffers of every form: for the GPU (ZSTD frames with their size, independent LZ4
    /// blocks, stored and plain ones) and for the host (ZSTD frames without their size,
    /// linked LZ4 blocks).
    fn mixed() -> Vec<(Vec<u8>, Form)> {
        let lz4 = |linked| Form::Lz4 {
            linked,
            big: false,
            content: true,
        };
        [
            Form::Plain,
            Form::Stored,
            Form::Zstd,
            Form::ZstdNoSize,
            lz4(false),
            lz4(true),
        ]
        .into_iter()
        .enumerate()
        .flat_map(|(i, f)| [10, 5000, 200_000].map(|n| (data(n, i as u8, n > 5000), f.clone())))
        .collect()
    }

    fn on_disk(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(bytes).unwrap();
        file
    }

    #[test]
    fn the_route_follows_the_plan_the_placement_and_the_decoder() {
        let (_, plain) = file_and_plan(&[(data(100, 1, false), Form::Plain)]);
        let (_, compressed) = file_and_plan(&[(data(100, 1, false), Form::Zstd)]);
        let gpu = Placement::Device(0);
        assert_eq!(route(&plain, gpu, true), Route::Plain);
        assert_eq!(route(&compressed, gpu, true), Route::GpuDecode);
        assert_eq!(route(&compressed, gpu, false), Route::HostDecode);
        assert_eq!(route(&compressed, Placement::Host, true), Route::HostDecode);
        // Arrays built after the read need the decoded bytes before a GPU decoder runs.
        let mut built = compressed.clone();
        built.built.push(Built { parts: Vec::new() });
        assert_eq!(route(&built, gpu, true), Route::HostDecode);
    }

    #[test]
    fn the_gpu_route_done_on_the_host_gives_the_host_decoders_table() {
        let (file, plan) = file_and_plan(&mixed());
        let expected = decode_to_host(file.as_slice(), &plan, ALIGN).unwrap();
        let path = on_disk(&file);
        let settings = Settings::default();
        let reader = SourceReader::open(path.path(), &settings).unwrap();
        let (mut table, work) =
            read_for_gpu_decoder(&settings, reader, plan, Placement::Host).unwrap();
        let work = work.unwrap();
        assert_eq!(table.offsets, expected.offsets);
        // Every piece lies inside the memory it names, and the GPU gets real work.
        let (source, memory) = (&work.source, &table.memory);
        let inside = |at: u64, len: u64, m: &Allocation| {
            at >= m.base() && at + len <= m.base() + m.size() as u64
        };
        let pieces = work.pieces(&table);
        for p in &pieces {
            assert!(inside(p.src, p.src_len, source), "{p:?}");
            assert!(inside(p.dst, p.dst_len, memory), "{p:?}");
        }
        assert!(pieces.iter().any(|p| p.step == Step::Zstd));
        assert!(pieces.iter().any(|p| p.step == Step::Lz4));
        work.decode_on_host(&mut table).unwrap();
        let mut expected = expected.memory;
        assert_eq!(
            host_bytes(&mut table.memory).unwrap(),
            host_bytes(&mut expected).unwrap()
        );
    }

    #[test]
    fn the_host_fallback_names_a_buffer_the_gpu_could_not_decode() {
        let (file, plan) = file_and_plan(&[
            (data(5000, 1, true), Form::Plain),
            (data(5000, 2, true), Form::Zstd),
        ]);
        let path = on_disk(&file);
        let settings = Settings::default();
        let reader = SourceReader::open(path.path(), &settings).unwrap();
        let (mut table, work) =
            read_for_gpu_decoder(&settings, reader, plan, Placement::Host).unwrap();
        let mut work = work.unwrap();
        // The frame's first block header as read (past the length prefix and the 13-byte
        // frame header the plan checked), damaged: a reserved block type.
        let at = work.sources[1] + 8 + 13;
        host_bytes(&mut work.source).unwrap()[at..at + 3].fill(0xFF);
        let err = work.decode_on_host(&mut table).unwrap_err().to_string();
        assert!(err.contains("buffer 1") && err.contains("Zstd"), "{err}");
    }

    #[test]
    fn an_uncompressed_table_is_its_files_bytes() {
        let (file, plan) = file_and_plan(&[
            (data(1000, 1, false), Form::Plain),
            (data(77, 2, false), Form::Plain),
        ]);
        let path = on_disk(&file);
        let settings = Settings::default();
        let reader = SourceReader::open(path.path(), &settings).unwrap();
        let ranges = plan.ranges.clone();
        let mut table = read_plain(&settings, reader, plan, Placement::Host).unwrap();
        let bytes = host_bytes(&mut table.memory).unwrap();
        for (r, &(offset, len)) in ranges.iter().enumerate() {
            let (at, len) = (table.offsets[r], len as usize);
            assert_eq!(at % ALIGN, 0);
            assert_eq!(
                &bytes[at..at + len],
                &file[offset as usize..offset as usize + len]
            );
        }
    }
}
