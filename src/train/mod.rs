//! The training run, top to bottom: data → model → optimizer → epochs of (train, validate,
//! checkpoint, metrics) → the best epoch's classification report.
pub mod amp;
pub mod checkpoint;
pub mod eval;
pub mod optim;
pub mod schedule;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use tch::{Device, Kind, Reduction, Tensor};

use crate::atomic;
use crate::config::{resolve_device, TrainConfig};
use crate::data::folder::ImageFolder;
use crate::data::loader::{Batch, Loader, LoaderOptions, Shard};
use crate::data::transform::Transform;
use crate::data::Normalizer;
use crate::dist::ddp::Ddp;
use crate::dist::launcher::DEVICE_VAR;
use crate::dist::process_group::{nccl_available, Backend, ProcessGroup, ReduceOp};
use crate::dist::DistSetup;
use crate::error::user_error;
use crate::model::Model;
use crate::report::classification::ClassificationReport;
use crate::report::metrics_csv::{self, EpochRow};
use crate::report::progress::EpochProgress;
use crate::report::tensorboard::EventWriter;
use crate::report::{plots, write_evaluation};
use crate::say;
use crate::shim;
use checkpoint::CheckpointState;

pub struct RunSummary {
    pub best_epoch: usize,
    /// The classification report of the best epoch's validation.
    pub report: ClassificationReport,
}

/// Images the `i`-th training batch of an epoch should hold on this rank.
fn batch_len(loader: &Loader, i: usize, batch: usize) -> usize {
    batch.min(loader.shard_len() - i * batch)
}

/// Keeps a training batch at its size when some of its images could not be read, by repeating
/// readable ones: every rank then takes the same steps with the same batch size, and BatchNorm
/// never sees a batch of one.
fn refill(batch: Batch, want: usize) -> Result<Batch> {
    let have = batch.indices.len();
    if have == want {
        return Ok(batch);
    }
    if have == 0 {
        return Err(user_error("every image of a training batch was unreadable (see the warnings above); use --strict to stop at the first one"));
    }
    let pick: Vec<i64> = (0..want as i64).map(|j| j % have as i64).collect();
    let idx = Tensor::from_slice(&pick);
    Ok(Batch {
        images: batch.images.index_select(0, &idx),
        labels: batch.labels.index_select(0, &idx),
        indices: pick.iter().map(|&j| batch.indices[j as usize]).collect(),
        skipped: batch.skipped,
    })
}

/// A data set where nothing decodes is an error before training, not a run of skipped batches.
fn check_something_decodes(paths: &[PathBuf], root: &std::path::Path) -> Result<()> {
    let mut first_error = None;
    for p in paths {
        match crate::data::decode::decode_rgb(p) {
            Ok(_) => return Ok(()),
            Err(e) if first_error.is_none() => first_error = Some(format!("{e:#}")),
            Err(_) => {}
        }
    }
    Err(user_error(format!(
        "none of the first {} images under {} could be read (first error: {})",
        paths.len(),
        root.display(),
        first_error.unwrap_or_default()
    )))
}

/// One warning per unreadable file for the whole run (it comes back every epoch).
fn warn_once(warned: &mut std::collections::HashSet<PathBuf>, skipped: &[(PathBuf, String)]) {
    for (p, e) in skipped {
        if warned.insert(p.clone()) {
            crate::report::progress::warn_unreadable(p, e);
        }
    }
}

fn fmt_duration(s: f64) -> String {
    let s = s.round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// Trains as described by `cfg`: alone, or as one rank of a data-parallel job (`dist`).
pub fn run(cfg: &TrainConfig, dist: Option<&DistSetup>) -> Result<RunSummary> {
    cfg.validate()?;
    let mut device = resolve_device(&cfg.device)?;
    let (rank, world, local_world) = dist
        .map(|d| (d.env.rank, d.env.world_size, d.env.local_world_size))
        .unwrap_or((0, 1, 1));
    if let (Device::Cuda(_), Some(d)) = (device, dist) {
        // Each worker pins itself to GPU local_rank, or to the one `--devices` gave it.
        let idx = std::env::var(DEVICE_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d.env.local_rank);
        if idx as i64 >= tch::Cuda::device_count() {
            return Err(user_error(format!(
                "rank {rank} needs CUDA device {idx}, but {} are visible",
                tch::Cuda::device_count()
            )));
        }
        device = Device::Cuda(idx);
    }
    let is_main = rank == 0;
    if !is_main {
        crate::report::progress::set_quiet(true); // only rank 0 reports; errors still go to stderr
    }
    if cfg.batch_size % world != 0 {
        return Err(user_error(format!(
            "--batch-size {} (the global batch) must be divisible by the world size {world}",
            cfg.batch_size
        )));
    }
    let rank_batch = cfg.batch_size / world;
    // The node's cores are shared among its ranks, for data workers and (as torchrun does)
    // for libtorch's intra-op threads.
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    if local_world > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        tch::set_num_threads((cores / local_world).max(1) as i32);
    }
    // validate() refused an earlier run in --out unless --overwrite: then its events go too.
    let run_dir = cfg.out.clone();
    if is_main && cfg.holds_run() {
        for e in std::fs::read_dir(&run_dir)?.flatten() {
            if e.file_name().to_string_lossy().starts_with("events.out.tfevents.") {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    if device.is_cuda() {
        tch::Cuda::cudnn_set_benchmark(true);
    }
    tch::manual_seed(cfg.seed as i64);

    // ---- data
    let data_dir = cfg.data.as_ref().expect("validated");
    let train_folder = ImageFolder::scan(data_dir, "--data")?;
    let classes = train_folder.classes.clone();
    let (train_samples, val_samples) = match &cfg.val {
        Some(v) => {
            let val_folder = ImageFolder::scan(v, "--val")?;
            val_folder.check_same_classes(&train_folder)?;
            (train_folder.samples.clone(), val_folder.samples)
        }
        None => crate::data::split::stratified(&train_folder, cfg.val_split, cfg.seed),
    };
    let workers = cfg.workers.unwrap_or((cores / local_world).max(1));
    let n_train = train_samples.len();
    let probe: Vec<PathBuf> = train_samples.iter().take(1000).map(|s| s.0.clone()).collect();
    check_something_decodes(&probe, data_dir)?;
    let shard = |pad| (world > 1).then_some(Shard { rank, world, pad });
    let train_loader = Loader::new(
        train_samples,
        Transform::Train {
            size: cfg.img_size,
            scale: (cfg.crop_scale[0], cfg.crop_scale[1]),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            hflip: cfg.hflip,
        },
        // A last batch of one image would break BatchNorm's training statistics: drop only that.
        // Padded shards are equal, so every rank takes the same number of steps.
        LoaderOptions {
            batch_size: rank_batch,
            shuffle: true,
            drop_last: n_train.div_ceil(world) % rank_batch == 1,
            seed: cfg.seed,
            workers,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            shard: shard(true),
        },
    )?;
    let val_loader = Loader::new(
        val_samples,
        Transform::Eval {
            size: cfg.img_size,
            resize: cfg.eval_resize(),
        },
        LoaderOptions {
            batch_size: rank_batch,
            shuffle: false,
            drop_last: false,
            seed: cfg.seed,
            workers,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            shard: shard(false),
        },
    )?;

    // ---- run directory: rank 0 alone writes
    let mut tb = None;
    if is_main {
        std::fs::create_dir_all(&run_dir).with_context(|| format!("creating --out {}", run_dir.display()))?;
        atomic::write_file(&run_dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
        let mut w = EventWriter::create(&run_dir)?;
        w.text("config", &format!("```toml\n{}\n```", cfg.to_toml()?), 0)?;
        tb = Some(w);
    }

    // ---- model, optimizer, schedule
    let mut model = Model::new(&cfg.model, classes.len() as i64, device)?;
    if let Some(path) = &cfg.pretrained {
        let r = model.load_pretrained(path)?;
        say!(
            "pretrained: {} tensors from {}; re-initialised head {:?}; missing {:?}; unexpected {:?}",
            r.loaded,
            path.display(),
            r.reinitialized_head,
            r.missing,
            r.unexpected
        );
    }
    if !cfg.freeze.is_empty() {
        let n = model.freeze(&cfg.freeze)?;
        say!("frozen: {n} tensors under {}", cfg.freeze.join(", "));
    }
    let channels_last = cfg.channels_last.unwrap_or(device.is_cuda());
    if channels_last {
        shim::var_store_to_channels_last(&model.vs)?;
    }
    let mut opt = optim::build(cfg, &model.vs)?;
    // Frozen parameters get no gradient: leave them out of clipping, scaling and all-reduce.
    let params: Vec<Tensor> = model
        .vs
        .trainable_variables()
        .into_iter()
        .filter(|p| p.requires_grad())
        .collect();
    let buffers: Vec<Tensor> = {
        let vars = model.vs.variables();
        let mut names: Vec<&String> = vars.keys().filter(|k| !vars[*k].requires_grad()).collect();
        names.sort();
        names.into_iter().map(|k| vars[k].shallow_clone()).collect()
    };

    // ---- data parallelism: rendezvous, then every replica starts from rank 0's state
    let ddp = match dist {
        Some(d) => {
            let backend = if device.is_cuda() && nccl_available() {
                Backend::Nccl
            } else {
                Backend::Gloo
            };
            let pg = ProcessGroup::new(backend, &d.env.master_addr, d.env.master_port, rank, world, d.timeout)?;
            let ddp = Ddp::new(pg, &params, d.bucket_mb, d.grad_compress)?;
            ddp.broadcast_state(&model.vs)?;
            say!(
                "distributed: {world} ranks ({}), {backend:?}, master {}:{}, global batch {} = {world} × {rank_batch}, {} gradient buckets of ≤ {} MB{}{}",
                d.env.source,
                d.env.master_addr,
                d.env.master_port,
                cfg.batch_size,
                ddp.num_buckets(),
                d.bucket_mb,
                d.grad_compress.map(|k| format!(", all-reduce in {k:?}")).unwrap_or_default(),
                if d.sync_bn { ", SyncBatchNorm" } else { "" }
            );
            Some(ddp)
        }
        None => None,
    };
    let pg = ddp.as_ref().map(|d| &d.pg);
    let sync_bn = dist.is_some_and(|d| d.sync_bn);
    let _sync_bn_guard = pg.filter(|_| sync_bn).map(crate::model::batchnorm::sync_batch_norm);
    let steps_per_epoch = train_loader.batches_per_epoch();
    let sched = schedule::LrSchedule::new(cfg, steps_per_epoch);
    let normalize = Normalizer::new(cfg.mean3(), cfg.std3(), device);
    let amp_kind = amp::resolve(&cfg.amp, device)?;
    let mut scaler = (amp_kind == Some(Kind::Half)).then(|| amp::GradScaler::new(device, cfg.loss_scale));
    say!(
        "ringtrain: {} ({:.1}M parameters) on {:?}{}, {} classes, {} train / {} val images, {} steps per epoch, {} data workers",
        cfg.model,
        model.num_parameters() as f64 / 1e6,
        device,
        match (amp_kind, &scaler) {
            (Some(k), Some(s)) => format!(", autocast {k:?} with {} loss scaling", if s.state().dynamic { "dynamic" } else { "static" }),
            (Some(k), None) => format!(", autocast {k:?}"),
            _ => String::new(),
        },
        classes.len(),
        n_train,
        val_loader.num_samples(),
        steps_per_epoch,
        workers
    );

    let mut rows: Vec<EpochRow> = Vec::new();
    let mut best: Option<(usize, eval::EvalResult)> = None;
    let mut global_step = 0usize;
    let mut warned: std::collections::HashSet<PathBuf> = Default::default();
    let run_start = Instant::now();
    for epoch in 0..cfg.epochs {
        // ---- train one epoch
        let t0 = Instant::now();
        let mut loss_sum = Tensor::zeros([], (Kind::Float, device));
        let mut correct = Tensor::zeros([], (Kind::Int64, device));
        let mut seen = 0usize;
        let mut skipped_steps = 0usize;
        let mut unreadable = 0usize;
        let mut lr = sched.lr_at(global_step);
        let progress = EpochProgress::new(epoch + 1, cfg.epochs, steps_per_epoch, cfg.log_every);
        for (i, batch) in train_loader.epoch(epoch as u64).enumerate() {
            let batch = batch?;
            unreadable += batch.skipped.len();
            warn_once(&mut warned, &batch.skipped);
            let batch = refill(batch, batch_len(&train_loader, i, rank_batch))?;
            let mut x = normalize.apply(&batch.images);
            if channels_last {
                x = shim::to_channels_last(&x)?;
            }
            let y = batch.labels.to_device(device);
            lr = sched.lr_at(global_step);
            opt.set_lr(lr);
            if cfg.head_lr_mult != 1.0 {
                opt.set_lr_group(crate::model::HEAD_GROUP, lr * cfg.head_lr_mult);
            }
            if let Some(ddp) = ddp.as_ref().filter(|_| world > 1 && !sync_bn) {
                ddp.broadcast_buffers(&buffers)?;
            }
            let (logits, loss) = {
                // Forward and loss under autocast; backward and the step outside, as torch.autocast.
                let _autocast = amp_kind.map(|k| shim::autocast(device, k)).transpose()?;
                let logits = model.forward(&x, true);
                let loss = logits.cross_entropy_loss::<Tensor>(&y, None, Reduction::Mean, -100, cfg.label_smoothing);
                (logits, loss.to_kind(Kind::Float))
            };
            match ddp.as_ref().filter(|d| d.owns_grads()) {
                Some(ddp) => ddp.zero_grad(),
                None => opt.zero_grad(),
            }
            match &scaler {
                Some(s) => s.scale_loss(&loss).f_backward()?,
                None => loss.f_backward()?,
            }
            if let Some(ddp) = &ddp {
                ddp.all_reduce_grads()?;
            }
            let skip = match scaler.as_mut() {
                Some(s) => {
                    let grads: Vec<Tensor> = params.iter().map(|p| p.grad()).filter(|g| g.defined()).collect();
                    s.unscale(&grads, pg)?
                }
                None => false,
            };
            if skip {
                skipped_steps += 1;
            } else {
                if let Some(max_norm) = cfg.clip_grad_norm {
                    let _ = optim::clip_grad_norm(&params, max_norm);
                }
                opt.step();
            }
            if let Some(s) = scaler.as_mut() {
                s.update();
            }
            model.bn_batches += 1;
            global_step += 1;
            let bs = y.size()[0] as usize;
            seen += bs;
            tch::no_grad(|| {
                loss_sum += loss.detach() * bs as f64;
                correct += logits.argmax(-1, false).eq_tensor(&y).sum(Kind::Int64);
            });
            let loss_now = progress.wants_loss(i + 1).then(|| loss.double_value(&[]));
            if let (Some(l), Some(tb)) = (loss_now, tb.as_mut()) {
                // The 0-based index of the step just taken, as `epoch * len(loader) + i` in PyTorch scripts.
                tb.scalar("train/loss", l, global_step as i64 - 1)?;
                tb.scalar("train/lr", lr, global_step as i64 - 1)?;
                if cfg.head_lr_mult != 1.0 {
                    tb.scalar("train/lr_head", lr * cfg.head_lr_mult, global_step as i64 - 1)?;
                }
            }
            progress.update(i + 1, seen * world, loss_now, lr);
        }
        progress.finish();
        let train_secs = t0.elapsed().as_secs_f64();
        let comm_share = ddp.as_ref().map(|d| d.take_comm_time().as_secs_f64() / train_secs);
        // Epoch statistics over all ranks (padding repeats count as seen, as in DDP).
        let totals = Tensor::from_slice(&[loss_sum.double_value(&[]), correct.int64_value(&[]) as f64, seen as f64]);
        if let Some(pg) = pg {
            pg.all_reduce(&totals, ReduceOp::Sum)?;
        }
        let t = Vec::<f64>::try_from(&totals)?;
        let n = t[2].max(1.0);
        let (train_loss, train_top1) = (t[0] / n, t[1] / n);
        let seen = t[2] as usize;

        // ---- validate
        let ev = eval::evaluate(&model, &val_loader, &normalize, pg)?;
        warn_once(&mut warned, &ev.skipped);
        unreadable += ev.skipped.len();
        let row = EpochRow {
            epoch: epoch + 1,
            train_loss,
            train_top1,
            val_loss: ev.loss,
            val_top1: ev.top1,
            val_top5: ev.top5,
            lr,
            seconds: t0.elapsed().as_secs_f64(),
            images_per_s: seen as f64 / train_secs,
            skipped_steps,
        };
        let improved = best.as_ref().is_none_or(|(_, b)| ev.top1 > b.top1);
        if improved {
            best = Some((epoch + 1, ev.clone()));
        }
        let (best_epoch, best_top1) = best.as_ref().map(|(e, b)| (*e, b.top1)).expect("set above");

        // ---- checkpoints and metrics
        let state = CheckpointState {
            ringtrain_version: env!("CARGO_PKG_VERSION").into(),
            model: cfg.model.clone(),
            classes: classes.clone(),
            img_size: cfg.img_size,
            eval_resize: cfg.eval_resize(),
            mean: cfg.mean.clone(),
            std: cfg.std.clone(),
            epoch: epoch + 1,
            global_step,
            val_top1: Some(ev.top1),
            best_val_top1: Some(best_top1),
            best_epoch: Some(best_epoch),
            scaler: scaler.as_ref().map(|s| s.state()),
            config: cfg.clone(),
        };
        rows.push(row.clone());
        if let Some(tb) = tb.as_mut() {
            // Rank 0 (the one with the event writer) alone writes.
            checkpoint::save(&run_dir.join("last"), &model, &state)?;
            if improved {
                checkpoint::save(&run_dir.join("best"), &model, &state)?;
            }
            metrics_csv::write(&run_dir.join("metrics.csv"), &rows)?;
            plots::training_curves(&run_dir.join("curves.png"), &rows)?;
            let e = (epoch + 1) as i64;
            for (tag, v) in [
                ("epoch/train_loss", train_loss),
                ("epoch/train_top1", train_top1),
                ("epoch/val_loss", ev.loss),
                ("epoch/val_top1", ev.top1),
                ("epoch/val_top5", ev.top5),
                ("epoch/lr", lr),
                ("epoch/images_per_s", row.images_per_s),
                ("epoch/seconds", row.seconds),
                ("epoch/allreduce_share", comm_share.unwrap_or(0.0)),
                ("epoch/amp_skipped_steps", skipped_steps as f64),
                ("epoch/unreadable_images", unreadable as f64),
            ] {
                tb.scalar(tag, v, e)?;
            }
            tb.flush()?;
        }
        say!(
            "epoch {}/{} {} | train loss {:.4} top1 {:.2}% | val loss {:.4} top1 {:.2}% top5 {:.2}% | lr {:.5} | {:.0} img/s{} | best {:.2}% (epoch {})",
            epoch + 1,
            cfg.epochs,
            fmt_duration(row.seconds),
            train_loss,
            100.0 * train_top1,
            ev.loss,
            100.0 * ev.top1,
            100.0 * ev.top5,
            lr,
            row.images_per_s,
            comm_share.map(|c| format!(" (all-reduce {:.1}% of rank 0's time)", 100.0 * c)).unwrap_or_default()
                + &if unreadable > 0 { format!(" | {unreadable} unreadable images skipped") } else { String::new() },
            100.0 * best_top1,
            best_epoch
        );
    }
    let (best_epoch, best_ev) = best.expect("epochs >= 1");
    let report = if is_main {
        write_evaluation(
            &run_dir,
            &classes,
            &best_ev,
            &format!("{} — validation, best epoch {best_epoch}", cfg.model),
        )?
    } else {
        ClassificationReport::new(&classes, &best_ev.targets, &best_ev.preds)
    };
    say!(
        "done in {}: best val top1 {:.2}% at epoch {}; run directory {}",
        fmt_duration(run_start.elapsed().as_secs_f64()),
        100.0 * best_ev.top1,
        best_epoch,
        run_dir.display()
    );
    Ok(RunSummary { best_epoch, report })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_h_m_s() {
        assert_eq!(fmt_duration(5.2), "5s");
        assert_eq!(fmt_duration(65.0), "1m05s");
        assert_eq!(fmt_duration(3725.0), "1h02m05s");
    }
}
