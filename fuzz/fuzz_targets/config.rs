//! Any text as a --config file: TOML parsing, merging into the configuration (unknown keys,
//! wrong types) and validation. Errors, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = std::path::Path::new("fuzz.toml");
    if let Ok(table) = ringtrain::config::parse_toml(text, path) {
        if let Ok(cfg) = ringtrain::config::resolve(Some(table), toml::Table::new()) {
            let _ = cfg.preflight();
            let _ = cfg.to_toml();
        }
    }
});
