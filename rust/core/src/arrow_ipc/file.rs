//! An IPC file or stream opened through kvikpy's sources (local or remote), and its
//! metadata: the messages and the schema, read and checked through that one handle, from
//! which the read is planned.

use std::collections::HashMap;
use std::path::Path;

use super::framing::{scan, Messages, ReadAt};
use super::plan::{plan, ReadPlan};
use super::schema::{convert, IpcSchema};
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::settings::Settings;
use crate::span::HostSpan;

/// A file read through kvikpy's sources (local or remote).
pub struct SourceReader {
    handle: FileHandle,
    size: u64,
    settings: Settings,
}

impl SourceReader {
    /// Open `path` (a local path or a URL kvikpy reads) for reading.
    pub fn open(path: &Path, settings: &Settings) -> Result<Self> {
        let handle = FileHandle::open_with(path, "r", settings)?;
        let size = handle.get()?.size_for("read_ipc", settings)?;
        Ok(Self {
            handle,
            size,
            settings: settings.clone(),
        })
    }

    /// The open file and its size, for the batch read of the buffers a plan chose.
    pub(crate) fn into_handle(self) -> (FileHandle, u64) {
        (self.handle, self.size)
    }
}

impl ReadAt for SourceReader {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; len];
        let got = self.handle.get()?.read_host(
            HostSpan::from_slice(&mut bytes),
            offset,
            &self.settings,
        )?;
        if got < len {
            return Err(crate::source::truncated(
                self.handle.path(),
                offset,
                len,
                got,
            ));
        }
        Ok(bytes)
    }
}

/// An IPC file's metadata: its messages and schema.
#[derive(Debug)]
pub struct IpcFile {
    /// The messages.
    pub messages: Messages,
    /// The schema.
    pub schema: IpcSchema,
    /// The file's size.
    pub size: u64,
}

/// Column names an error message lists before saying how many more there are.
const SHOWN_NAMES: usize = 20;

impl IpcFile {
    /// Read the metadata of the IPC file or stream behind `reader`.
    pub fn read(reader: &(impl ReadAt + ?Sized)) -> Result<Self> {
        let messages = scan(reader)?;
        let schema = convert(messages.schema.schema()?)?;
        Ok(Self {
            messages,
            schema,
            size: reader.size(),
        })
    }

    /// The index of each column named in `names`, in that order (the first column of a
    /// name the table repeats). One map of the names, so choosing many columns is linear.
    pub fn column_indices(&self, names: &[String]) -> Result<Vec<usize>> {
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.schema.fields.len());
        for (i, f) in self.schema.fields.iter().enumerate() {
            index.entry(f.field.name().as_str()).or_insert(i);
        }
        names
            .iter()
            .map(|n| {
                index.get(n.as_str()).copied().ok_or_else(|| {
                    let have = &self.schema.fields;
                    let shown: Vec<&str> = have
                        .iter()
                        .take(SHOWN_NAMES)
                        .map(|f| f.field.name().as_str())
                        .collect();
                    let more = have.len().saturating_sub(SHOWN_NAMES);
                    let more = if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    };
                    Error::InvalidArgument(format!(
                        "the table has no column {n:?}; its columns are {shown:?}{more}"
                    ))
                })
            })
            .collect()
    }

    /// Plan reading `columns` of `batches` (all when `None`; negative indices count from
    /// the end).
    pub fn plan(&self, columns: Option<&[usize]>, batches: Option<&[i64]>) -> Result<ReadPlan> {
        plan(&self.messages, &self.schema, columns, batches, self.size)
    }
}
