//! Evaluation over a loader: mean cross-entropy, top-1, top-5, and every prediction with its
//! sample, loss and confidence (for the classification report and the worst images).
use anyhow::Result;
use tch::{Device, Kind, Reduction, Tensor};

use crate::data::load::loader::Loader;
use crate::data::load::normalize::Normalizer;
use crate::dist::process_group::{ProcessGroup, ReduceOp};
use crate::model::Model;

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EvalResult {
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub loss: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub top1: f64,
    #[serde(deserialize_with = "crate::serde_nan::f64_or_nan")]
    pub top5: f64,
    pub targets: Vec<i64>,
    pub preds: Vec<i64>,
    /// Images that could not be read (path, reason); not counted anywhere above. (Checkpoints
    /// written before the rename name it `skipped`.)
    #[serde(alias = "skipped")]
    pub unreadable: Vec<(std::path::PathBuf, String)>,
    /// Per prediction, in the order of `targets`: the sample's index in the loader's samples,
    /// its cross-entropy, and the softmax probability of the predicted class. (Empty in
    /// checkpoints written before they were kept.)
    #[serde(default)]
    pub indices: Vec<usize>,
    #[serde(default, deserialize_with = "crate::serde_nan::f32s_or_nan")]
    pub losses: Vec<f32>,
    #[serde(default, deserialize_with = "crate::serde_nan::f32s_or_nan")]
    pub confidence: Vec<f32>,
}

/// Evaluates this process's shard of `loader`; the sums and every prediction are combined over
/// the ranks of `pg`, so each sample counts exactly once. Sums and predictions
/// stay on the device until the end: no host synchronisation per batch.
pub fn evaluate(
    model: &Model,
    loader: &Loader,
    normalize: &Normalizer,
    pg: &ProcessGroup,
) -> Result<EvalResult> {
    let mut loss_sum: Option<Tensor> = None;
    let mut top5_sum: Option<Tensor> = None;
    let (mut targets, mut preds, mut indices) = (Vec::new(), Vec::new(), Vec::new());
    let (mut losses, mut confidence) = (Vec::new(), Vec::new());
    let unreadable = tch::no_grad(|| {
        loader.each_readable_batch(|batch| {
            let x = normalize.apply(&batch.images);
            let y = normalize.labels(&batch.labels);
            let logits = model.forward(&x, false).to_kind(Kind::Float);
            let loss = logits
                .cross_entropy_loss::<Tensor>(&y, None, Reduction::Sum, -100, 0.0)
                .to_kind(Kind::Double);
            losses.push(logits.cross_entropy_loss::<Tensor>(&y, None, Reduction::None, -100, 0.0));
            confidence.push(logits.softmax(1, Kind::Float).amax([1i64].as_slice(), false));
            let k = logits.size()[1].min(5);
            let (_, topk) = logits.topk(k, 1, true, true);
            let hits = topk.eq_tensor(&y.unsqueeze(1)).any_dim(1, false).sum(Kind::Int64);
            loss_sum = Some(loss_sum.take().map_or(loss.shallow_clone(), |s| s + &loss));
            top5_sum = Some(top5_sum.take().map_or(hits.shallow_clone(), |s| s + &hits));
            preds.push(topk.select(1, 0));
            targets.extend(Vec::<i64>::try_from(&batch.labels)?);
            indices.extend(batch.indices.iter().map(|&i| i as i64));
            Ok(())
        })
    })?;
    let host = |t: Option<Tensor>| t.map_or(0.0, |t| t.double_value(&[]));
    let preds: Vec<i64> = match preds.is_empty() {
        true => Vec::new(),
        false => Vec::<i64>::try_from(Tensor::cat(&preds, 0).to_device(Device::Cpu))?,
    };
    let sums = pg.all_reduce_values(&[host(loss_sum), host(top5_sum)], ReduceOp::Sum)?;
    let (loss_sum, top5) = (sums[0], sums[1]);
    let targets = pg.all_gather_values(&targets)?.concat();
    let preds = pg.all_gather_values(&preds)?.concat();
    let indices = pg.all_gather_values(&indices)?.concat().into_iter().map(|i| i as usize).collect();
    let losses = gather_f32(pg, losses)?;
    let confidence = gather_f32(pg, confidence)?;
    let n = targets.len().max(1) as f64;
    let correct = targets.iter().zip(&preds).filter(|(t, p)| t == p).count();
    Ok(EvalResult {
        loss: loss_sum / n,
        top1: correct as f64 / n,
        top5: top5 / n,
        targets,
        preds,
        unreadable,
        indices,
        losses,
        confidence,
    })
}

/// Per-batch values on the device → every rank's, in rank order (as bit patterns: the gather
/// takes non-negative integers).
fn gather_f32(pg: &ProcessGroup, parts: Vec<Tensor>) -> Result<Vec<f32>> {
    let mine: Vec<f32> = match parts.is_empty() {
        true => Vec::new(),
        false => Vec::<f32>::try_from(Tensor::cat(&parts, 0).to_kind(Kind::Float).to_device(Device::Cpu))?,
    };
    let bits: Vec<i64> = mine.iter().map(|v| v.to_bits() as i64).collect();
    Ok(pg.all_gather_values(&bits)?.concat().into_iter().map(|b| f32::from_bits(b as u32)).collect())
}
