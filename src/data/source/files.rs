//! The files a sharded source (tar shards, parquet files) or a pack reads: local paths, or
//! objects of an object store or web server read through the disk cache (`data/remote/`).
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use rayon::prelude::*;

use super::common::{stat_file, SourceFile};
use crate::data::remote::{cache, list, Object, ObjectCache};

/// The files of a sharded source (tar shards, parquet files) or a pack: local paths, or remote
/// objects read through the disk cache. `names` are what messages and sample names show (the
/// path, or the object's URL).
pub struct Files {
    pub names: Vec<PathBuf>,
    remote: Option<(Vec<Arc<Object>>, Arc<ObjectCache>)>,
}

impl Files {
    pub fn local(paths: Vec<PathBuf>) -> Files {
        Files {
            names: paths,
            remote: None,
        }
    }

    /// `objects`, fetched through the process's cache (`cache::shared`).
    pub fn remote(objects: Vec<Arc<Object>>) -> Result<Files> {
        Ok(Files {
            names: objects.iter().map(|o| PathBuf::from(&o.url)).collect(),
            remote: Some((objects, cache::shared()?)),
        })
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// File `i`, open for reading: a local file as it is, an object from the cache (fetched
    /// first when it is not there). Errors name the file or object; a local file that cannot
    /// be opened is a user error naming `what` it is ("shard", "parquet file").
    pub fn open(&self, i: usize, what: &str) -> Result<File> {
        match &self.remote {
            Some((objects, cache)) => cache.open(&objects[i]),
            None => File::open(&self.names[i])
                .map_err(|e| crate::error::user_error(format!("cannot open {what} {}: {e}", self.names[i].display()))),
        }
    }

    /// Each file's modification time (ns since the epoch): a local file's now, an object's as
    /// listed when the data was opened. A local file not there is a user error naming `what`.
    pub fn times(&self, what: &str) -> Result<Vec<i64>> {
        match &self.remote {
            Some((objects, _)) => Ok(objects.iter().map(|o| o.modified_ns).collect()),
            None => super::common::file_times(&self.names, what),
        }
    }

    /// Each file as a pack records its sources: a local file by its absolute path, with its size
    /// and time now; an object by its URL, with its size and time as listed.
    pub fn source_files(&self) -> Result<Vec<SourceFile>> {
        match &self.remote {
            Some((objects, _)) => Ok(objects
                .iter()
                .map(|o| SourceFile {
                    name: o.url.clone(),
                    size: o.size,
                    mtime_ns: o.modified_ns,
                })
                .collect()),
            None => self
                .names
                .iter()
                .map(|p| stat_file(&std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()))?))
                .collect(),
        }
    }

    /// The files that will be read next, in order: remote ones are fetched ahead of the reads
    /// (a few at a time, within the cache's budget). Nothing for local files.
    pub fn will_read(&self, files: &[usize]) {
        if let Some((objects, cache)) = &self.remote {
            cache.read_ahead(files.iter().map(|&i| objects[i].clone()).collect());
        }
    }

    /// `f` of each file's index, in parallel: remote files (fetched whole to be read) several
    /// at once on `fetch_pool`, as fetches wait on the network rather than the processor.
    pub fn each<T: Send>(&self, f: impl Fn(usize) -> Result<T> + Sync + Send) -> Result<Vec<T>> {
        let all = || (0..self.len()).into_par_iter().map(&f).collect();
        match self.is_remote() {
            false => all(),
            true => fetch_pool().install(all),
        }
    }

    /// The folder (or URL prefix) that holds them all ("" when none does).
    pub fn common_parent(&self) -> PathBuf {
        super::common::common_parent(&self.names)
    }
}

/// What a remote location names, found by listing or asking for each object: tar shards,
/// parquet files, or one other object (a pack).
pub enum RemoteKind {
    Shards(Vec<Arc<Object>>),
    Parquet(Vec<Arc<Object>>),
    Single(Arc<Object>),
}

impl RemoteKind {
    pub fn objects(&self) -> &[Arc<Object>] {
        match self {
            RemoteKind::Shards(o) | RemoteKind::Parquet(o) => o,
            RemoteKind::Single(o) => std::slice::from_ref(o),
        }
    }
}

/// Opens the remote location `location` names (`what`, the flag, for messages).
pub fn open_location(location: &str, what: &str) -> Result<RemoteKind> {
    let expanded = super::common::expand(location, what)?;
    let expanded: Vec<String> = expanded.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let objects = list(&expanded, what)?;
    let all = |ext: &str| objects.iter().all(|o| o.url.ends_with(ext));
    if all(".tar") {
        return Ok(RemoteKind::Shards(objects));
    }
    if all(".parquet") {
        return Ok(RemoteKind::Parquet(objects));
    }
    if objects.len() == 1 {
        return Ok(RemoteKind::Single(objects.into_iter().next().expect("one")));
    }
    crate::bail_user!(
        "{what} '{location}' names {} objects that are not all tar shards (.tar) or all parquet files (.parquet)",
        objects.len()
    )
}

/// The distinct values of `items`, in the order they first appear.
pub fn first_appearances(items: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    items.filter(|&i| seen.insert(i)).collect()
}

/// The threads remote files are fetched and scanned on when a source is opened: fetches wait on
/// the network, so more of them than processors.
pub fn fetch_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(8)
            .thread_name(|i| format!("ringtrain-open-{i}"))
            .build()
            .expect("a thread pool")
    })
}
