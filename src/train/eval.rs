//! Evaluation over a loader: mean cross-entropy, top-1, top-5, and every prediction (for the
//! classification report).
use anyhow::Result;
use tch::{Device, Kind, Reduction, Tensor};

use crate::data::{loader::Loader, Normalizer};
use crate::dist::process_group::{ProcessGroup, ReduceOp};
use crate::model::Model;

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EvalResult {
    #[serde(deserialize_with = "crate::train::checkpoint::f64_or_nan")]
    pub loss: f64,
    #[serde(deserialize_with = "crate::train::checkpoint::f64_or_nan")]
    pub top1: f64,
    #[serde(deserialize_with = "crate::train::checkpoint::f64_or_nan")]
    pub top5: f64,
    pub targets: Vec<i64>,
    pub preds: Vec<i64>,
    /// Images that could not be read (path, reason); not counted anywhere above.
    pub skipped: Vec<(std::path::PathBuf, String)>,
}

/// Evaluates this process's shard of `loader`; with a process group, the sums and every
/// prediction are combined over ranks, so each sample counts exactly once.
pub fn evaluate(
    model: &Model,
    loader: &Loader,
    normalize: &Normalizer,
    pg: Option<&ProcessGroup>,
) -> Result<EvalResult> {
    let mut loss_sum = 0.0;
    let mut top5 = 0i64;
    let (mut targets, mut preds, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    tch::no_grad(|| -> Result<()> {
        for batch in loader.epoch(0) {
            let mut batch = batch?;
            skipped.append(&mut batch.skipped);
            if batch.indices.is_empty() {
                continue;
            }
            let x = normalize.apply(&batch.images);
            let y = batch.labels.to_device(x.device());
            let logits = model.forward(&x, false).to_kind(Kind::Float);
            loss_sum += logits
                .cross_entropy_loss::<Tensor>(&y, None, Reduction::Sum, -100, 0.0)
                .double_value(&[]);
            let k = logits.size()[1].min(5);
            let (_, topk) = logits.topk(k, 1, true, true);
            top5 += topk
                .eq_tensor(&y.unsqueeze(1))
                .any_dim(1, false)
                .sum(Kind::Int64)
                .int64_value(&[]);
            preds.extend(Vec::<i64>::try_from(topk.select(1, 0).to_device(Device::Cpu))?);
            targets.extend(Vec::<i64>::try_from(&batch.labels)?);
        }
        Ok(())
    })?;
    if let Some(pg) = pg {
        let sums = Tensor::from_slice(&[loss_sum, top5 as f64]);
        pg.all_reduce(&sums, ReduceOp::Sum)?;
        let v = Vec::<f64>::try_from(&sums)?;
        (loss_sum, top5) = (v[0], v[1] as i64);
        targets = gather_i64(pg, &targets)?;
        preds = gather_i64(pg, &preds)?;
    }
    let n = targets.len().max(1) as f64;
    let correct = targets.iter().zip(&preds).filter(|(t, p)| t == p).count();
    Ok(EvalResult {
        loss: loss_sum / n,
        top1: correct as f64 / n,
        top5: top5 as f64 / n,
        targets,
        preds,
        skipped,
    })
}

/// Every rank's values, concatenated in rank order (shards may differ in length).
fn gather_i64(pg: &ProcessGroup, values: &[i64]) -> Result<Vec<i64>> {
    let len = Tensor::from_slice(&[values.len() as i64]);
    pg.all_reduce(&len, ReduceOp::Max)?;
    let max = len.int64_value(&[0]);
    let padded = Tensor::full([max], -1i64, (Kind::Int64, Device::Cpu));
    if !values.is_empty() {
        padded
            .narrow(0, 0, values.len() as i64)
            .copy_(&Tensor::from_slice(values));
    }
    let out = Tensor::zeros([pg.world_size as i64, max], (Kind::Int64, Device::Cpu));
    pg.all_gather(&out, &padded)?;
    Ok(Vec::<i64>::try_from(out.flatten(0, -1))?
        .into_iter()
        .filter(|&v| v >= 0)
        .collect())
}
