//! Any bytes as a checkpoint's files: as state.json (serde + the checks after it), as a
//! safetensors file read the way checkpoints are, and as a --pretrained file (safetensors, or
//! else a PyTorch checkpoint: zip, legacy stream or tar, its pickle read without calling
//! anything), then matched by name and shape into a model. Errors, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringtrain::model::Model;
use ringtrain::train::lifecycle::checkpoint::{parse_state, read_tensors};

fuzz_target!(|data: &[u8]| {
    let dir = std::path::Path::new("fuzz-checkpoint");
    let _ = parse_state(data, dir, "--resume");
    let file = std::env::temp_dir().join(format!("ringtrain-fuzz-{}.safetensors", std::process::id()));
    std::fs::write(&file, data).unwrap();
    let _ = read_tensors(&file, "--resume");
    let mut model = Model::new(ringtrain::model::ModelKind::LeNet5, 3, tch::Device::Cpu);
    if let Ok(loaded) = ringtrain::model::weights::read_file(&file, None) {
        let _ = model.load_pretrained(&loaded.weights, "fuzz");
    }
});
