//! `_lib.RemoteHandle`: a remote file (HTTP(S), S3, WebHDFS) opened by one of kvikio's
//! constructors, and the `_lib.FileHandle` through which it is read (the engine's one
//! request path, as for local files).

use std::sync::Arc;

use kvikpy_core::source::remote::S3Options;
use kvikpy_core::source::remote::{self, Endpoint, EndpointType, RemoteSource};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use kvikpy_core::cancel::CancelToken;

use crate::blocking::interruptible_alone;
use crate::errors::BindResult;
use crate::file::FileHandle;

/// An open remote file (the private handle behind `kvikpy.RemoteFile`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct RemoteHandle {
    source: Arc<RemoteSource>,
    file: Py<FileHandle>,
}

fn endpoint_type(value: u8) -> Result<EndpointType, Error> {
    EndpointType::from_value(value).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{value} is not a RemoteEndpointType value (0 to 5); pass a member of \
             kvikpy.RemoteEndpointType"
        ))
    })
}

impl RemoteHandle {
    /// Open `endpoint` (made without the GIL: making an S3 endpoint reads nothing
    /// remote, but opening asks the server for the size, which Ctrl-C interrupts).
    fn open_with(
        py: Python<'_>,
        nbytes: Option<u64>,
        make: impl FnOnce() -> kvikpy_core::Result<Endpoint> + Send + 'static,
    ) -> BindResult<Self> {
        let source = interruptible_alone(py, &CancelToken::new(), move || {
            let settings = kvikpy_core::settings::current()?;
            RemoteSource::open(make()?, nbytes, &settings)
        })?;
        Self::wrap(py, source)
    }

    fn wrap(py: Python<'_>, source: RemoteSource) -> BindResult<Self> {
        let source = Arc::new(source);
        let reason = format!("a remote file read over {}", source.endpoint_type().label());
        let core = kvikpy_core::FileHandle::from_source(Arc::clone(&source) as _, reason);
        let file = Py::new(py, FileHandle::from_core(core))?;
        Ok(Self { source, file })
    }
}

/// S3 credentials and endpoint for the signed constructors (`_lib.S3Credentials`): each
/// field left `None` is read from its AWS environment variable when the request is made.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct S3Credentials {
    options: S3Options,
}

#[boundary]
#[pymethods]
impl S3Credentials {
    #[new]
    #[pyo3(signature = (region=None, access_key_id=None, secret_access_key=None,
        endpoint_url=None, session_token=None))]
    fn new(
        region: Option<String>,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        endpoint_url: Option<String>,
        session_token: Option<String>,
    ) -> Self {
        Self {
            options: S3Options {
                region,
                access_key: access_key_id,
                secret_key: secret_access_key,
                endpoint_url,
                session_token,
            },
        }
    }
}

#[boundary]
#[pymethods]
impl RemoteHandle {
    #[staticmethod]
    #[pyo3(signature = (url, nbytes=None))]
    fn open_http(py: Python<'_>, url: String, nbytes: Option<u64>) -> BindResult<Self> {
        Self::open_with(py, nbytes, move || Endpoint::http(&url))
    }

    #[staticmethod]
    #[pyo3(signature = (bucket_name, object_name, nbytes, credentials))]
    fn open_s3(
        py: Python<'_>,
        bucket_name: String,
        object_name: String,
        nbytes: Option<u64>,
        credentials: &S3Credentials,
    ) -> BindResult<Self> {
        let options = credentials.options.clone();
        Self::open_with(py, nbytes, move || {
            Endpoint::s3_bucket(&bucket_name, &object_name, &options)
        })
    }

    /// The object at an `s3://` URL, or (`http`) at its HTTP(S) URL, where the
    /// credentials' endpoint is not used (the URL is the endpoint).
    #[staticmethod]
    #[pyo3(signature = (url, nbytes, credentials, http))]
    fn open_s3_url(
        py: Python<'_>,
        url: String,
        nbytes: Option<u64>,
        credentials: &S3Credentials,
        http: bool,
    ) -> BindResult<Self> {
        if http {
            let options = S3Options {
                endpoint_url: None,
                ..credentials.options.clone()
            };
            return Self::open_with(py, nbytes, move || Endpoint::s3_http(&url, &options));
        }
        let options = credentials.options.clone();
        Self::open_with(py, nbytes, move || Endpoint::s3_url(&url, &options))
    }

    #[staticmethod]
    #[pyo3(signature = (url, nbytes=None))]
    fn open_s3_public(py: Python<'_>, url: String, nbytes: Option<u64>) -> BindResult<Self> {
        Self::open_with(py, nbytes, move || Endpoint::s3_public(&url))
    }

    #[staticmethod]
    #[pyo3(signature = (presigned_url, nbytes=None))]
    fn open_s3_presigned_url(
        py: Python<'_>,
        presigned_url: String,
        nbytes: Option<u64>,
    ) -> BindResult<Self> {
        Self::open_with(py, nbytes, move || Endpoint::s3_presigned(&presigned_url))
    }

    #[staticmethod]
    #[pyo3(signature = (url, nbytes=None))]
    fn open_webhdfs(py: Python<'_>, url: String, nbytes: Option<u64>) -> BindResult<Self> {
        Self::open_with(py, nbytes, move || Endpoint::webhdfs(&url))
    }

    /// kvikio's `RemoteHandle::open`: the endpoint type given (a value of
    /// `RemoteEndpointType`) or inferred, checked against `allow_list` (values too).
    #[staticmethod]
    #[pyo3(signature = (url, remote_endpoint_type=0, allow_list=None, nbytes=None))]
    fn open(
        py: Python<'_>,
        url: String,
        remote_endpoint_type: u8,
        allow_list: Option<Vec<u8>>,
        nbytes: Option<u64>,
    ) -> BindResult<Self> {
        let kind = endpoint_type(remote_endpoint_type)?;
        let allow = allow_list
            .map(|values| {
                values
                    .into_iter()
                    .map(endpoint_type)
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let source = interruptible_alone(py, &CancelToken::new(), move || {
            let settings = kvikpy_core::settings::current()?;
            remote::open_url(&url, kind, allow.as_deref(), nbytes, &settings)
        })?;
        Self::wrap(py, source)
    }

    /// The size in bytes (known since the file was opened).
    fn nbytes(&self) -> u64 {
        self.source.nbytes()
    }

    /// The endpoint type's value (`RemoteEndpointType`).
    fn remote_endpoint_type(&self) -> u8 {
        self.source.endpoint_type() as u8
    }

    /// The file's URL.
    #[getter]
    fn url(&self) -> String {
        self.source.url().to_string()
    }

    /// The handle reads go through.
    #[getter]
    fn file(&self, py: Python<'_>) -> Py<FileHandle> {
        self.file.clone_ref(py)
    }
}

/// The endpoint type's value that `RemoteFile.open(url)` would pick; no request is sent.
#[boundary]
#[pyfunction]
pub fn infer_remote_endpoint_type(url: &str) -> BindResult<u8> {
    Ok(remote::infer_endpoint_type(url)? as u8)
}

/// The URL schemes remote files have (`"http"`, ...): the engine's one list, which
/// `kvikpy._paths.is_url` asks for.
#[boundary]
#[pyfunction]
pub fn url_schemes() -> Vec<&'static str> {
    kvikpy_core::source::URL_SCHEMES.to_vec()
}
