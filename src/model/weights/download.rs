//! Downloads of published weights into the caches PyTorch and the Hugging Face hub keep, so a
//! file either side fetched serves the other: streamed to a temporary sibling while its SHA-256
//! is taken, checked, then renamed into place. A failed or wrong download leaves nothing behind.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use sha2::{Digest, Sha256};

use crate::bail_user;

/// torch.hub's folder, as `torch.hub.get_dir()` resolves it: `$TORCH_HOME/hub`, else
/// `$XDG_CACHE_HOME/torch/hub`, else `~/.cache/torch/hub`. Weights go in its `checkpoints/`.
pub fn torch_hub_dir() -> PathBuf {
    match std::env::var_os("TORCH_HOME") {
        Some(t) => PathBuf::from(t).join("hub"),
        None => cache_home().join("torch").join("hub"),
    }
}

/// `$XDG_CACHE_HOME`, else `~/.cache`.
pub fn cache_home() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache"))
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// What a download must hash to.
pub enum Expect<'a> {
    /// The first hex digits of its SHA-256 (torchvision's file names carry them).
    Sha256Prefix(&'a str),
    /// Its whole SHA-256 (the hub's ETag of a large file).
    Sha256(&'a str),
    /// Nothing to check against (a small file the hub keeps in git).
    Unchecked,
}

/// One HTTP(S) client for every request: the proxy from `HTTPS_PROXY`/`ALL_PROXY`, a bounded wait
/// for a connection and for the response's headers, none for the body (weights are large).
pub fn agent(follow_redirects: bool) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .max_redirects(if follow_redirects { 10 } else { 0 })
        .max_redirects_will_error(false)
        .http_status_as_error(false)
        .user_agent(concat!("ringtrain/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// Downloads `url` into `dest` (its folder created), checking `expect` before the file appears
/// there. `what` names the weights in messages (`--pretrained torchvision:resnet50`).
pub fn fetch(url: &str, dest: &Path, expect: Expect<'_>, what: &str) -> Result<()> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    if let Err(e) = std::fs::create_dir_all(dir) {
        bail_user!("{what}: cannot create the cache folder {} ({e})", dir.display());
    }
    let offline = || {
        format!(
            "without a network, download {url} elsewhere and place it at {}",
            dest.display()
        )
    };
    let mut resp = match agent(true).get(url).call() {
        Ok(r) => r,
        Err(e) => bail_user!("{what}: cannot download {url} ({e}); {}", offline()),
    };
    if !resp.status().is_success() {
        bail_user!("{what}: {url} answered {}; {}", resp.status(), offline());
    }
    let len: Option<u64> = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    crate::say!("downloading {url} to {}", dest.display());
    let bar = crate::report::progress::count_bar(len.unwrap_or(0), "bytes");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut body = resp.body_mut().as_reader();
    let written = crate::atomic::write_file_with(dest, |f| {
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => bail_user!(
                    "{what}: the download of {url} broke off after {total} bytes ({e}); nothing was kept, run again to retry"
                ),
            };
            hash.update(&buf[..n]);
            f.write_all(&buf[..n])?;
            total += n as u64;
            bar.set_position(total);
        }
        if let Some(want) = len.filter(|&n| n != total) {
            bail_user!("{what}: the download of {url} ended after {total} of {want} bytes; nothing was kept, run again to retry");
        }
        let got = format!("{:x}", hash.finalize());
        let ok = match expect {
            Expect::Sha256Prefix(p) => got.starts_with(p),
            Expect::Sha256(h) => got.eq_ignore_ascii_case(h),
            Expect::Unchecked => true,
        };
        if !ok {
            let want = match expect {
                Expect::Sha256Prefix(p) => format!("{p}…"),
                Expect::Sha256(h) => h.to_string(),
                Expect::Unchecked => unreachable!(),
            };
            bail_user!("{what}: {url} has SHA-256 {got}, expected {want}: refused, nothing was kept");
        }
        Ok(total)
    });
    bar.finish_and_clear();
    written.map(|_| ())
}
