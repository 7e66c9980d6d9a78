//! Sources: every way the engine reaches a file's bytes, behind one trait, and the one
//! place where the source for a path is chosen.
//!
//! A [`Source`] has a size, reads and writes host spans, may expose a descriptor, and may
//! move bytes to or from device memory by itself ([`Source::device_direct`]: GPUDirect
//! Storage, page-cache DMA). Everything above this module (the request path, the bounce
//! ring, batches) talks to `dyn Source` only.
//!
//! Adding a source is one file in this folder (a type implementing [`Source`] and an
//! `open` function with the [`Opener`](choose::Opener) signature) and one line in
//! [`OPENERS`](choose::OPENERS). A source
//! that callers ask for by name instead (the mmap source behind `kvikpy.Mmap`) is one
//! file with its own constructor, and stays out of [`OPENERS`](choose::OPENERS).

mod base;
mod choose;
pub(crate) mod cufile;
mod mapping;
pub(crate) mod mmap;
mod page_cache_dma;
pub(crate) mod posix;
mod posix_io;
pub mod remote;
pub mod residency;

// This file defines nothing: it names the modules and hands their names on, so a source
// that names `super::Source` depends on `base.rs`, never on the chooser above it.
pub use base::Source;
pub(crate) use base::{truncated, unsized_file, Direct, Keepalive, Ordered, Target};
pub use choose::is_remote;
pub(crate) use choose::{open, open_sized};
pub use mapping::{page_size, FileMapping};
pub use page_cache_dma::bytes_moved as page_cache_dma_bytes;
pub use posix::direct_read_bytes;
pub(crate) use remote::url::redact;
pub use remote::URL_SCHEMES;
pub use residency::probes as residency_probes;
// The fork hook: a child forgets the parent's TLS connections (see `remote::tls`).
pub(crate) use remote::tls::forget_in_child;
