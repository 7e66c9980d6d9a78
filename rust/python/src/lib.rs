//! `kvikpy._lib`: the thin pyo3 layer over kvikpy-core. It converts arguments, maps engine
//! errors to Python exceptions and releases the GIL around everything that blocks; all
//! behaviour lives in the engine.

mod arrow;
mod arrow_c;
mod batch;
mod blocking;
mod boundary;
mod buffer;
mod calls;
mod ceiling;
mod cuda;
mod cufile;
mod cupy;
mod dlpack;
mod errors;
mod file;
mod future;
mod intake;
mod mmap;
mod modules;
mod page_cache;
mod read;
mod remote;
mod replace;
mod safetensors;
mod settings;
mod torch;

use pyo3::prelude::*;

#[pymodule]
fn _lib(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A child forked while I/O runs gets a fresh pool and locks (see kvikpy_core::atfork).
    kvikpy_core::atfork::install().map_err(errors::BindError::Engine)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("__git_commit__", env!("KVIKPY_GIT_COMMIT"))?;
    m.add_class::<file::FileHandle>()?;
    m.add_class::<mmap::MmapHandle>()?;
    m.add_class::<future::Future>()?;
    m.add_class::<future::StreamFuture>()?;
    m.add_class::<buffer::Buffer>()?;
    m.add_function(wrap_pyfunction!(cuda::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::device_count, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::current_device, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::device_lookup, m)?)?;
    m.add_function(wrap_pyfunction!(read::read_file, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_new_header, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_merge, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_pack, m)?)?;
    m.add_function(wrap_pyfunction!(safetensors::safetensors_windows, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::page_cache_dma_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::live_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::item_types, m)?)?;
    m.add_function(wrap_pyfunction!(intake::buffer_nbytes, m)?)?;
    m.add_function(wrap_pyfunction!(intake::buffer_extent, m)?)?;
    m.add_function(wrap_pyfunction!(batch::read_files_batch, m)?)?;
    m.add_class::<batch::Progress>()?;
    m.add_function(wrap_pyfunction!(batch::read_ranges_batch, m)?)?;
    m.add_function(wrap_pyfunction!(batch::read_file_ranges_batch, m)?)?;
    m.add_function(wrap_pyfunction!(batch::read_scattered, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::batch_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::read_ipc_table, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::write_ipc_stream, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::write_ipc_array, m)?)?;
    m.add_class::<arrow::IpcRead>()?;
    m.add_function(wrap_pyfunction!(arrow::ipc_decode_plan, m)?)?;
    m.add_class::<arrow::IpcTable>()?;
    m.add_function(wrap_pyfunction!(arrow::batch_schema, m)?)?;
    m.add_function(wrap_pyfunction!(arrow_c::check_device_kwargs, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::batch_device_meta, m)?)?;
    m.add_class::<arrow::BatchDeviceMeta>()?;
    m.add_function(wrap_pyfunction!(arrow::device_stream_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(arrow::host_stream_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(future::wait_for_io, m)?)?;
    m.add_function(wrap_pyfunction!(future::cancel_remote_io, m)?)?;
    m.add_function(wrap_pyfunction!(settings::get_setting, m)?)?;
    m.add_function(wrap_pyfunction!(settings::set_settings, m)?)?;
    m.add_function(wrap_pyfunction!(settings::setting_names, m)?)?;
    m.add_function(wrap_pyfunction!(settings::setting_variables, m)?)?;
    m.add_function(wrap_pyfunction!(settings::is_compat_mode_preferred, m)?)?;
    m.add_function(wrap_pyfunction!(settings::default_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(settings::bounce_buffer_free, m)?)?;
    m.add_function(wrap_pyfunction!(settings::thread_pool_size, m)?)?;
    m.add_function(wrap_pyfunction!(settings::device_pool_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(settings::gpu_pool_threads, m)?)?;
    m.add_function(wrap_pyfunction!(blocking::_panic_for_tests, m)?)?;
    m.add_function(wrap_pyfunction!(ceiling::pread_ceiling, m)?)?;
    m.add_function(wrap_pyfunction!(ceiling::copy_wall, m)?)?;
    m.add_function(wrap_pyfunction!(ceiling::profile_enable, m)?)?;
    m.add_function(wrap_pyfunction!(ceiling::profile_phases, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_version, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_driver_open, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_driver_close, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_properties, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_set_property, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::cufile_status, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::memory_register, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::memory_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::stream_register, m)?)?;
    m.add_function(wrap_pyfunction!(cufile::stream_deregister, m)?)?;
    m.add_function(wrap_pyfunction!(page_cache::page_cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(page_cache::drop_file_page_cache, m)?)?;
    m.add_function(wrap_pyfunction!(page_cache::drop_system_page_cache, m)?)?;
    m.add_function(wrap_pyfunction!(page_cache::read_path_counters, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_os_error_for_tests, m)?)?;
    m.add_class::<replace::Replacement>()?;
    m.add_function(wrap_pyfunction!(replace::sync_directory, m)?)?;
    m.add_class::<remote::RemoteHandle>()?;
    m.add_class::<remote::S3Credentials>()?;
    m.add_function(wrap_pyfunction!(remote::infer_remote_endpoint_type, m)?)?;
    m.add_function(wrap_pyfunction!(remote::url_schemes, m)?)?;
    Ok(())
}
