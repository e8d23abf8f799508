//! Remote locations and their objects: which store a URL names (one client per bucket or web
//! server, built from the environment as the provider's SDK would find it), the objects a
//! pattern names (braces expanded, `*` by listing the prefix), and an object fetched whole into a
//! local file. Every failure is one line naming the object: not found, access denied (and where
//! the credentials came from), changed under the run, or what was left after the retries.
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Result;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, RetryConfig};

use crate::bail_user;
use crate::error::{unfetchable, user_error};

/// Retries of a failed request (5xx, throttling, a dropped connection) before it is an error,
/// with exponential backoff from 100 ms to 15 s, and at most this long for one request in all.
const MAX_RETRIES: usize = 10;
const RETRY_TIMEOUT: Duration = Duration::from_secs(180);

/// The schemes ringtrain reads: object stores and web servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
}

fn scheme_of(location: &str) -> Option<Scheme> {
    let (scheme, rest) = location.split_once("://")?;
    if rest.is_empty() {
        return None;
    }
    match scheme.to_ascii_lowercase().as_str() {
        "s3" | "s3a" => Some(Scheme::S3),
        "gs" | "gcs" => Some(Scheme::Gcs),
        "az" | "azure" | "abfs" | "abfss" => Some(Scheme::Azure),
        "http" | "https" => Some(Scheme::Http),
        _ => None,
    }
}

/// Whether `location` is an object store's or a web server's (`s3://`, `gs://`, `az://`,
/// `http(s)://`).
pub fn is_remote(location: &str) -> bool {
    scheme_of(location).is_some()
}

/// One bucket's or server's client.
pub struct Store {
    client: Box<dyn ObjectStore>,
    /// `s3://bucket`, `https://host:port`: what object keys follow.
    base: String,
    /// Where the credentials came from, for an access denied.
    credentials: String,
    scheme: Scheme,
}

/// The tokio runtime `object_store`'s calls run on: two threads, whatever the callers (the
/// loader's workers wait on it).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ringtrain-fetch")
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// `fut` run to its end on the runtime, from a thread outside it.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    runtime().block_on(fut)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where a provider's client finds its credentials, named (never their values).
fn credentials_source(scheme: Scheme) -> String {
    let first = |names: &[&str], otherwise: &str| {
        names.iter().find(|n| env(n).is_some()).map_or(otherwise.to_owned(), |n| format!("{n} from the environment"))
    };
    match scheme {
        Scheme::S3 if env("AWS_SKIP_SIGNATURE").is_some() => "unsigned requests (AWS_SKIP_SIGNATURE)".into(),
        Scheme::S3 => first(
            &["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"],
            "the instance metadata service (no AWS_ACCESS_KEY_ID in the environment)",
        ),
        Scheme::Gcs => first(
            &["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"],
            "application default credentials or the metadata server",
        ),
        Scheme::Azure => first(
            &["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_TOKEN"],
            "a managed identity (no AZURE_STORAGE_ACCOUNT_KEY in the environment)",
        ),
        Scheme::Http => "none: a web server is read without credentials".into(),
    }
}

impl Store {
    /// The client of the bucket or server `location` lies in (one per process, shared), and the
    /// object key after it.
    fn of(location: &str, what: &str) -> Result<(Arc<Store>, String)> {
        static STORES: OnceLock<Mutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
        let Some(scheme) = scheme_of(location) else {
            bail_user!("{what} '{location}' is not an s3://, gs://, az:// or http(s):// location");
        };
        let url = match url::Url::parse(location) {
            Ok(u) if u.host_str().is_some() => u,
            _ => bail_user!("{what} '{location}' is not a URL with a bucket or host"),
        };
        let base = url[..url::Position::BeforePath].to_owned();
        // Keys as written (object_store takes them unencoded); brace patterns are expanded first.
        let key = location[base.len()..].trim_start_matches('/').to_owned();
        let mut stores = STORES.get_or_init(Default::default).lock().expect("the stores' lock");
        if let Some(s) = stores.get(&base) {
            return Ok((s.clone(), key));
        }
        let client = build(scheme, &base).map_err(|e| user_error(format!("{what} '{location}': {}", one_line(&e))))?;
        let store = Arc::new(Store {
            client,
            base: base.clone(),
            credentials: credentials_source(scheme),
            scheme,
        });
        stores.insert(base, store.clone());
        Ok((store, key))
    }

    /// `e`, an error reading `url`, as one line a user can act on.
    fn explain(&self, e: object_store::Error, url: &str, what: &str) -> anyhow::Error {
        use object_store::Error as E;
        let line = match &e {
            E::NotFound { .. } => format!("{what}: {url}: no such object"),
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                format!("{what}: {url}: access denied (credentials: {})", self.credentials)
            }
            E::Precondition { .. } => format!(
                "{what}: {url} changed while this run read it (its ETag is no longer the one it had when the data was opened); start the run again, or resume it, to read the new version"
            ),
            _ => format!("{what}: cannot read {url}: {}", one_line(&e)),
        };
        unfetchable(line)
    }
}

/// An error and its causes on one line.
fn one_line(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text += &format!(": {s_text}");
        }
        source = s.source();
    }
    redact_queries(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// `text` with the query of every URL in it cut off: a SAS token or a presigned URL's signature
/// must not reach a message.
fn redact_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let ends_url = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')');
        let end = rest[at..].find(ends_url).map_or(rest.len(), |e| at + e);
        let url = &rest[..end];
        match url[at..].find('?') {
            Some(q) => out.push_str(&format!("{}?…", &url[..at + q])),
            None => out.push_str(url),
        }
        rest = &rest[end..];
    }
    out + rest
}

fn build(scheme: Scheme, base: &str) -> object_store::Result<Box<dyn ObjectStore>> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: MAX_RETRIES,
        retry_timeout: RETRY_TIMEOUT,
    };
    Ok(match scheme {
        Scheme::S3 => {
            // An S3-compatible store on plain HTTP (a test server, a store inside the cluster)
            // is named by its endpoint: allowed because it was asked for.
            let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"].into_iter().find_map(env);
            let plain = endpoint.is_some_and(|e| e.starts_with("http://"));
            let builder = object_store::aws::AmazonS3Builder::from_env().with_url(base).with_retry(retry);
            Box::new(builder.with_allow_http(plain).build()?)
        }
        Scheme::Gcs => {
            let builder = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(base);
            Box::new(builder.with_retry(retry).build()?)
        }
        Scheme::Azure => {
            let builder = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(base);
            Box::new(builder.with_retry(retry).build()?)
        }
        Scheme::Http => Box::new(
            object_store::http::HttpBuilder::new()
                .with_url(base)
                .with_retry(retry)
                .with_client_options(ClientOptions::new().with_allow_http(true))
                .build()?,
        ),
    })
}

/// An object as listed when the data was opened: reads of it later must find the same version.
pub struct Object {
    /// Its full location, as messages and sample names show it.
    pub url: String,
    pub size: u64,
    /// The version read: fetches ask for this ETag and fail if the object changed.
    pub etag: Option<String>,
    /// Its last modification, ns since the epoch.
    pub modified_ns: i64,
    /// Its file name in the cache (`cache_name`).
    name: String,
    key: ObjectPath,
    store: Arc<Store>,
}

impl Object {
    fn from_meta(store: &Arc<Store>, meta: object_store::ObjectMeta) -> Object {
        let url = format!("{}/{}", store.base, meta.location);
        let modified_ns = meta.last_modified.timestamp_nanos_opt().unwrap_or(0);
        Object {
            name: cache_name(&url, meta.size, meta.e_tag.as_deref(), modified_ns),
            url,
            size: meta.size,
            etag: meta.e_tag,
            modified_ns,
            key: meta.location,
            store: store.clone(),
        }
    }

    /// Its file name in the cache: changes with the object's version.
    pub fn cache_name(&self) -> &str {
        &self.name
    }

    /// The object's bytes streamed into `out` (memory stays at one chunk whatever its size),
    /// the version listed or none: a changed ETag or size is an error. Returns the bytes written.
    pub fn fetch_into(&self, out: &mut impl Write) -> Result<u64> {
        let what = "data";
        let options = GetOptions {
            if_match: self.etag.clone(),
            ..Default::default()
        };
        block_on(async {
            let explain = |e| self.store.explain(e, &self.url, what);
            let got = self.store.client.get_opts(&self.key, options).await.map_err(explain)?;
            let mut stream = got.into_stream();
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(explain)?;
                out.write_all(&chunk).map_err(|e| unfetchable(format!("cannot write {} to the cache: {e}", self.url)))?;
                written += chunk.len() as u64;
            }
            if written != self.size {
                return Err(unfetchable(format!(
                    "{what}: {} changed while this run read it ({} bytes when the data was opened, {written} now)",
                    self.url, self.size
                )));
            }
            Ok(written)
        })
    }
}

impl Object {
    /// The first `n` bytes of the object (fewer if it is shorter): `doctor`'s check that it can
    /// be read.
    pub fn read_start(&self, n: u64) -> Result<Vec<u8>> {
        let options = GetOptions {
            if_match: self.etag.clone(),
            range: Some(object_store::GetRange::Bounded(0..n.min(self.size))),
            ..Default::default()
        };
        block_on(async {
            let explain = |e| self.store.explain(e, &self.url, "--data");
            let got = self.store.client.get_opts(&self.key, options).await.map_err(explain)?;
            let bytes = got.bytes().await.map_err(explain)?;
            Ok(bytes.to_vec())
        })
    }

    /// Where the credentials of the object's store came from.
    pub fn credentials(&self) -> &str {
        &self.store.credentials
    }
}

/// A name for the cache that changes with the object's version: a hash of the URL, size, ETag
/// and modification time, with the URL's extension.
fn cache_name(url: &str, size: u64, etag: Option<&str>, modified_ns: i64) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(url.as_bytes());
    h.update(size.to_le_bytes());
    h.update(etag.unwrap_or("").as_bytes());
    h.update(modified_ns.to_le_bytes());
    let hex: String = h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect();
    let ext = Path::new(url).extension().and_then(|e| e.to_str()).unwrap_or("bin");
    format!("{hex}.{ext}")
}

/// The objects `locations` (without braces: they are expanded first) name, in order: one object
/// asked for by its key (up to 32 asked at once); a `*`/`?` pattern's found by listing the
/// prefix before it (sorted by key); a location ending in `/` the objects directly under it.
/// `what` names the flag.
pub fn list(locations: &[String], what: &str) -> Result<Vec<Arc<Object>>> {
    let mut parts: Vec<Vec<Object>> = Vec::with_capacity(locations.len());
    let mut heads = Vec::new();
    for location in locations {
        let (store, key) = Store::of(location, what)?;
        if key.contains(['*', '?', '[']) || key.ends_with('/') || key.is_empty() {
            let found = list_matching(&store, &key, location, what)?;
            if found.is_empty() {
                bail_user!("{what} '{location}' matches no object");
            }
            parts.push(found);
        } else {
            heads.push((parts.len(), store, key, location));
            parts.push(Vec::new());
        }
    }
    let asked = block_on(
        futures_util::stream::iter(heads.iter().map(|(_, store, key, url)| async move {
            let meta = store.client.head(&ObjectPath::from(key.as_str())).await;
            let meta = meta.map_err(|e| store.explain(e, url, what))?;
            Ok::<_, anyhow::Error>(Object::from_meta(store, meta))
        }))
        .buffered(32)
        .collect::<Vec<_>>(),
    );
    for ((at, ..), object) in heads.iter().zip(asked) {
        parts[*at].push(object?);
    }
    Ok(parts.into_iter().flatten().map(Arc::new).collect())
}

/// The objects whose keys match `pattern` (`*` within one level), or lie directly under it when
/// it ends in `/`.
fn list_matching(store: &Arc<Store>, pattern: &str, url: &str, what: &str) -> Result<Vec<Object>> {
    if store.scheme == Scheme::Http {
        bail_user!(
            "{what} '{url}': a web server's files cannot be listed; name them, e.g. with a brace pattern such as 'https://host/train-{{000000..000146}}.tar'"
        );
    }
    let wild = pattern.find(['*', '?', '[']).unwrap_or(pattern.len());
    let prefix = &pattern[..pattern[..wild].rfind('/').map_or(0, |i| i + 1)];
    let matcher = match pattern.ends_with('/') || pattern.is_empty() {
        true => None,
        false => Some(glob::Pattern::new(pattern).map_err(|e| user_error(format!("{what} '{url}': {e}")))?),
    };
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let prefix_path = (!prefix.is_empty()).then(|| ObjectPath::from(prefix.trim_end_matches('/')));
    let metas: Vec<object_store::ObjectMeta> = block_on(async {
        let mut listing = store.client.list(prefix_path.as_ref());
        let mut metas = Vec::new();
        while let Some(m) = listing.next().await {
            metas.push(m.map_err(|e| store.explain(e, url, what))?);
        }
        Ok::<_, anyhow::Error>(metas)
    })?;
    let mut found: Vec<Object> = metas
        .into_iter()
        .filter(|m| {
            let key = m.location.as_ref();
            match &matcher {
                Some(p) => p.matches_with(key, options),
                None => key.strip_prefix(prefix).is_some_and(|rest| !rest.contains('/')),
            }
        })
        .map(|m| Object::from_meta(store, m))
        .collect();
    found.sort_by(|a, b| a.key.as_ref().cmp(b.key.as_ref()));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_known_by_their_prefix() {
        for remote in ["s3://b/k.tar", "S3://b/x", "gs://b/x", "az://c/x", "https://h/x", "http://127.0.0.1:9/x"] {
            assert!(is_remote(remote), "{remote}");
        }
        for local in ["data/x.tar", "/abs/x", "s3:/x", "ftp://h/x", "pipe:curl x", "c://"] {
            assert!(!is_remote(local), "{local}");
        }
    }

    #[test]
    fn queries_are_cut_from_messages() {
        assert_eq!(
            redact_queries("GET https://a.blob.core.windows.net/c/x.tar?sv=1&sig=SECRET failed: (https://h/y?k=v)"),
            "GET https://a.blob.core.windows.net/c/x.tar?… failed: (https://h/y?…)"
        );
        assert_eq!(redact_queries("no url here"), "no url here");
    }
}
