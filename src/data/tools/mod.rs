//! The data commands, one file each: `ringtrain demo` (the built-in data set), `pack`, `split`
//! and `stats`. They use the sources, decoding and transforms; nothing in `data/` uses them.
pub mod demo;
pub mod pack;
pub mod split;
pub mod stats;
