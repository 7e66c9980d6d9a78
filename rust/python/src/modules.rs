//! Modules the binding looks for without importing them (torch, CuPy): an object of
//! theirs can only exist once the program has imported them, so until then their fast
//! paths cost a glance at `sys.modules`, not an import.

use std::sync::atomic::{AtomicIsize, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};

/// The number of entries of `sys.modules` when a module was last found missing, for
/// [`loaded`]; -1 before the first look.
struct Watch(AtomicIsize);

impl Watch {
    const fn new() -> Self {
        Self(AtomicIsize::new(-1))
    }
}

/// `sys.modules[name]` if the program has imported it. While it has not, a call costs a
/// comparison of the size of `sys.modules` with the size `watch` saw last time: an
/// import adds entries, so an unchanged size means the module is still missing. (A size
/// unchanged by an import and a removal between two calls only delays the finding to the
/// next import.)
fn loaded<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
    watch: &Watch,
) -> Option<Bound<'py, PyAny>> {
    // SAFETY: with the GIL held, PyImport_GetModuleDict returns a borrowed reference to
    // the interpreter's `sys.modules` dict (never null after initialisation; checked).
    let modules = unsafe { ffi::PyImport_GetModuleDict() };
    if modules.is_null() {
        return None;
    }
    // SAFETY: `modules` is a live borrowed reference, held while the GIL is.
    let modules = unsafe { Bound::from_borrowed_ptr(py, modules) };
    let modules = modules.cast::<PyDict>().ok()?;
    let size = modules.len() as isize;
    if watch.0.load(Ordering::Relaxed) == size {
        return None;
    }
    let found = modules.get_item(name).ok().flatten();
    if found.is_none() {
        watch.0.store(size, Ordering::Relaxed);
    }
    found
}

/// What a fast path needs of a module, taken from it once the program has imported it
/// and kept: [`loaded`]'s watch and the answer.
pub struct Found<T> {
    answer: PyOnceLock<Option<T>>,
    watch: Watch,
}

impl<T> Found<T> {
    pub const fn new() -> Self {
        Self {
            answer: PyOnceLock::new(),
            watch: Watch::new(),
        }
    }

    /// The pieces `find` takes from module `name`, or `None` while the program has not
    /// imported it. `find` answers `None` to look again next time (a module still being
    /// imported lacks its attributes), `Some(None)` where the module lacks the pieces
    /// (never looked for again).
    pub fn get<'a>(
        &'a self,
        py: Python<'_>,
        name: &Bound<'_, PyString>,
        find: impl FnOnce(&Bound<'_, PyAny>) -> Option<Option<T>>,
    ) -> Option<&'a T> {
        if let Some(found) = self.answer.get(py) {
            return found.as_ref();
        }
        let module = loaded(py, name, &self.watch)?;
        let found = find(&module)?;
        self.answer.get_or_init(py, || found).as_ref()
    }
}
