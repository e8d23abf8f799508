//! Any bytes as a pack file: opened and validated as `--data FILE.pack` is, then every record
//! read as the loader reads it (raw pixels viewed, encoded bytes decoded). Errors, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringtrain::data::source::pack::{Contents, Pack};

fuzz_target!(|data: &[u8]| {
    let file = std::env::temp_dir().join(format!("ringtrain-fuzz-{}.pack", std::process::id()));
    std::fs::write(&file, data).unwrap();
    if let Ok(pack) = Pack::open(&file, "--data") {
        for i in 0..pack.len() {
            let _ = pack.name(i);
            match pack.contents(i) {
                Contents::Raw(v) => assert_eq!(v.px.len(), v.width as usize * v.height as usize * 3),
                Contents::Encoded(bytes) => {
                    let _ = ringtrain::data::decode::decode_bytes(bytes, std::path::Path::new("fuzz.pack"));
                }
            }
        }
    }
});
