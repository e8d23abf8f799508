//! JSON has no NaN: serde_json writes a NaN (a diverged loss, say) as null, and these read it
//! back, so the checkpoint and the metrics of a run that went wrong still load.
use serde::Deserialize;

/// A number, or NaN where JSON holds null.
pub fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `f64_or_nan` for a list of f32 (per-image losses); a missing list is empty.
pub fn f32s_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    Ok(Vec::<Option<f32>>::deserialize(d)?.into_iter().map(|v| v.unwrap_or(f32::NAN)).collect())
}
