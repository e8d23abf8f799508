//! The RAM cache (`--cache`): each image is decoded once, in the first epoch, and its pixels are
//! kept for the epochs after it, within a memory budget shared by the run's loaders. Images are
//! kept whole (as decoded, before any crop), so every later epoch draws new crops from them; a
//! JPEG that would otherwise be decoded at 1/8 size for a small crop is then decoded whole, as
//! PIL does.
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::data::pixels::RgbView;
use crate::data::source::{Samples, Stored};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Cache when the whole data set (training and validation) is estimated to fit the budget.
    Auto,
    /// Cache what fits the budget, in the order images are first read.
    Ram,
    Off,
}

/// Bytes the caches of one process may hold, shared by its loaders.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes from the budget if they fit.
    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok()
    }
}

/// The default budget: half of the memory available when the run starts, shared equally by the
/// node's ranks (each caches what it reads).
pub fn default_budget(local_ranks: usize) -> u64 {
    let available = crate::doctor::system::memory().map_or(0, |m| m.1);
    available / 2 / local_ranks.max(1) as u64
}

struct Pixels {
    width: u32,
    height: u32,
    px: Box<[u8]>,
}

/// Decoded images of one loader's samples, by sample index.
pub struct Cache {
    slots: Vec<OnceLock<Pixels>>,
    budget: Arc<Budget>,
}

impl Cache {
    pub fn new(samples: usize, budget: Arc<Budget>) -> Cache {
        Cache {
            slots: (0..samples).map(|_| OnceLock::new()).collect(),
            budget,
        }
    }

    pub fn get(&self, i: usize) -> Option<RgbView<'_>> {
        self.slots[i].get().map(|p| RgbView {
            width: p.width,
            height: p.height,
            px: &p.px,
        })
    }

    /// Keeps sample `i`'s pixels (`width`×`height` RGB8) if the budget allows; a second put
    /// of the same sample is ignored.
    pub fn put(&self, i: usize, width: u32, height: u32, px: Vec<u8>) {
        let n = px.len() as u64;
        if self.slots[i].get().is_none() && self.budget.take(n) {
            let p = Pixels {
                width,
                height,
                px: px.into_boxed_slice(),
            };
            if self.slots[i].set(p).is_err() {
                self.budget.used.fetch_sub(n, Ordering::Relaxed);
            }
        }
    }
}

/// Estimated bytes of `samples` decoded: the headers of up to 64 images spread over them, their
/// mean size times the count. Unreadable headers count as nothing.
pub fn estimate_decoded(samples: &Samples) -> u64 {
    let n = samples.len();
    if n == 0 {
        return 0;
    }
    let k = n.min(64);
    let picks: Vec<usize> = (0..k).map(|j| j * n / k).collect();
    let sizes: u64 = picks
        .iter()
        .map(|&i| match samples.read(i) {
            Ok(Stored::Raw(v)) => v.px.len() as u64,
            Ok(Stored::Encoded(bytes)) => image::ImageReader::new(Cursor::new(&bytes[..]))
                .with_guessed_format()
                .ok()
                .and_then(|r| r.into_dimensions().ok())
                .map_or(0, |(w, h)| w as u64 * h as u64 * 3),
            Err(_) => 0,
        })
        .sum();
    sizes * n as u64 / picks.len() as u64
}

/// The run's decision, for its banner.
#[derive(Debug, Clone)]
pub struct CachePlan {
    pub budget: Option<Arc<Budget>>,
    pub note: String,
}

impl CachePlan {
    /// No cache, for the reason `note` gives.
    pub fn off(note: &str) -> CachePlan {
        CachePlan {
            budget: None,
            note: note.into(),
        }
    }
}

/// Whether to cache `sets` (training and validation samples) under `mode` with `limit` bytes.
pub fn plan(mode: CacheMode, sets: &[&Samples], limit: u64) -> CachePlan {
    if mode == CacheMode::Off {
        return CachePlan::off("RAM cache off");
    }
    if sets.iter().all(|s| s.decoded()) {
        return CachePlan::off("RAM cache off: a raw pack is decoded already");
    }
    let need: u64 = sets.iter().filter(|s| !s.decoded()).map(|s| estimate_decoded(s)).sum();
    let gb = |b: u64| b as f64 / 1e9;
    if mode == CacheMode::Auto && need > limit {
        return CachePlan::off(&format!(
            "RAM cache off: the images need about {:.2} GB decoded, over the {:.2} GB budget (--cache ram caches what fits; --cache-gb sets the budget)",
            gb(need),
            gb(limit)
        ));
    }
    CachePlan {
        budget: Some(Budget::new(limit)),
        note: format!(
            "RAM cache on: about {:.2} GB of decoded images{}, budget {:.2} GB",
            gb(need),
            if need > limit { " (what fits is kept)" } else { "" },
            gb(limit)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_exceeded_and_a_slot_is_filled_once() {
        let budget = Budget::new(100);
        let cache = Cache::new(3, budget.clone());
        let img = |w: u32| (w, 4, vec![7u8; (w * 12) as usize]);
        let put = |i, (w, h, px)| cache.put(i, w, h, px);
        put(0, img(4));
        put(0, img(2));
        assert_eq!(cache.get(0).unwrap().width, 4, "the first put stays");
        put(1, img(4));
        assert_eq!(budget.used(), 96);
        put(2, img(2));
        assert!(cache.get(2).is_none(), "over the budget: not kept");
        assert_eq!(budget.used(), 96);
    }
}
