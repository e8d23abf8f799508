//! Evaluation over a loader: mean cross-entropy, top-1, top-5, and every prediction (for the
//! classification report).
use anyhow::Result;
use tch::{Device, Kind, Reduction, Tensor};

use crate::data::{loader::Loader, normalize_on_device};
use crate::model::Model;

#[derive(Debug, Clone, Default)]
pub struct EvalResult {
    pub loss: f64,
    pub top1: f64,
    pub top5: f64,
    pub targets: Vec<i64>,
    pub preds: Vec<i64>,
    /// Images that could not be read (path, reason); not counted anywhere above.
    pub skipped: Vec<(std::path::PathBuf, String)>,
}

pub fn evaluate(model: &Model, loader: &Loader, device: Device, mean: [f64; 3], std: [f64; 3]) -> Result<EvalResult> {
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
            let x = normalize_on_device(&batch.images, device, mean, std);
            let y = batch.labels.to_device(device);
            let logits = model.forward(&x, false).to_kind(Kind::Float);
            loss_sum += logits.cross_entropy_loss::<Tensor>(&y, None, Reduction::Sum, -100, 0.0).double_value(&[]);
            let k = logits.size()[1].min(5);
            let (_, topk) = logits.topk(k, 1, true, true);
            top5 += topk.eq_tensor(&y.unsqueeze(1)).any_dim(1, false).sum(Kind::Int64).int64_value(&[]);
            preds.extend(Vec::<i64>::try_from(topk.select(1, 0).to_device(Device::Cpu))?);
            targets.extend(Vec::<i64>::try_from(&batch.labels)?);
        }
        Ok(())
    })?;
    let n = targets.len().max(1) as f64;
    let correct = targets.iter().zip(&preds).filter(|(t, p)| t == p).count();
    Ok(EvalResult { loss: loss_sum / n, top1: correct as f64 / n, top5: top5 as f64 / n, targets, preds, skipped })
}
