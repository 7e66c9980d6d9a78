//! Arrow IPC files and streams read without host decoding: the framing and metadata are
//! parsed and checked here (with arrow-ipc's verified flatbuffers), and the chosen
//! columns' buffers become byte ranges that one batch read places in one allocation
//! (`read`: the whole read, from the one open file to the finished table).
//!
//! Every offset and length from the file is checked against the body and the file with
//! checked arithmetic before anything is allocated; the bytes a plan reads never exceed
//! the file's size.

mod built;
mod compression;
mod concat;
mod file;
mod framing;
mod gpu_decode;
mod lz4;
mod plan;
mod read;
mod runs;
mod schema;
mod write;

// The surface the binding uses (reading: a table read into one allocation, the arrays
// over it and the work left for a GPU decoder; writing: the encoder); the rest is the
// reader's and writer's own.
pub use built::{build, join_column, BuiltArrays, JoinedColumn};
pub use file::{IpcFile, SourceReader};
pub use gpu_decode::{Placed, Step};
pub use plan::{tensor_values, Column, Layout, ReadPlan};
pub use read::{
    addresses, plan_file_decode, read_table, FileDecodePlan, GpuWork, Table, TableRequest,
};
pub use write::{check_schema, write_file, ArrayIn, FileEncoder, Memory};

// Names `tests.rs` takes from here (it uses `super::*`).
#[cfg(test)]
use compression::{decode, Codec};
#[cfg(test)]
use concat::{concat, Part};
#[cfg(test)]
use framing::{scan, Format, Kind, SchemaBytes};

#[cfg(test)]
mod tests;
