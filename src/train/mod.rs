//! The training run, top to bottom: data → model → optimizer → epochs of (train, validate,
//! checkpoint, metrics) → the best epoch's classification report.
pub mod amp;
pub mod checkpoint;
pub mod divergence;
pub mod ema;
pub mod eval;
pub mod optim;
pub mod schedule;
pub mod signals;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use tch::{Kind, Reduction, Tensor};

use crate::atomic;
use crate::config::{Metric, SchedKind, TrainConfig};
use crate::data::folder::ImageFolder;
use crate::data::loader::{Batch, Loader, LoaderOptions, Shard};
use crate::data::mixup::{mix_rng, soft_target_cross_entropy, Mixup};
use crate::data::transform::Transform;
use crate::data::Normalizer;
use crate::dist::ddp::Ddp;
use crate::dist::process_group::{Backend, ProcessGroup, ReduceOp};
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
use checkpoint::{CheckpointState, EpochPosition};
use divergence::DivergenceGuard;
use ema::Ema;
use optim::Optimizer;
use schedule::PlateauState;
use signals::StopRequest;

pub struct RunSummary {
    pub best_epoch: usize,
    /// The classification report of the best epoch's validation (None when interrupted).
    pub report: Option<ClassificationReport>,
    /// The signal that stopped the run early (its checkpoint is saved).
    pub interrupted: Option<i32>,
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
    cfg.preflight()?;
    let mut device = cfg.device.resolve()?;
    let (rank, world, local_world) = dist
        .map(|d| (d.env.rank, d.env.world_size, d.env.local_world_size))
        .unwrap_or((0, 1, 1));
    if let Some(d) = dist {
        device = crate::dist::worker_device(device, &d.env)?;
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
    let run_dir = cfg.out.clone();
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
    if cfg.batch_size > n_train {
        return Err(user_error(format!(
            "--batch-size {} is larger than the {n_train} training images in {}: no full batch exists",
            cfg.batch_size,
            data_dir.display()
        )));
    }
    let shard = |pad| (world > 1).then_some(Shard { rank, world, pad });
    let channels_last = cfg.channels_last.unwrap_or(device.is_cuda());
    let normalize = Normalizer::new(cfg.mean3(), cfg.std3(), device).channels_last(channels_last);
    let train_loader = Loader::new(
        train_samples,
        Transform::Train {
            size: cfg.img_size,
            scale: (cfg.crop_scale[0], cfg.crop_scale[1]),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            hflip: cfg.hflip,
            erase: (cfg.random_erasing > 0.0).then(|| crate::data::erasing::RandomErasing {
                p: cfg.random_erasing,
                mode: cfg.random_erasing_mode,
                mean: cfg.mean3(),
                std: cfg.std3(),
            }),
            pad: cfg.crop_padding,
        },
        // A last batch of one image would break BatchNorm's training statistics: drop only that.
        // Padded shards are equal, so every rank takes the same number of steps.
        LoaderOptions {
            shuffle: true,
            drop_last: n_train.div_ceil(world) % rank_batch == 1,
            seed: cfg.seed,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            shard: shard(true),
            ..LoaderOptions::in_order(rank_batch, workers).for_device(&normalize)
        },
    )?;
    let val_loader = Loader::new(
        val_samples,
        Transform::Eval {
            size: cfg.img_size,
            resize: cfg.eval_resize(),
        },
        LoaderOptions {
            seed: cfg.seed,
            prefetch: cfg.prefetch,
            skip_unreadable: !cfg.strict,
            shard: shard(false),
            ..LoaderOptions::in_order(rank_batch, workers).for_device(&normalize)
        },
    )?;

    // ---- resume: which checkpoint, and whether it fits this run
    let resume_from = match &cfg.resume {
        Some(r) => checkpoint::resume_dir(r, &cfg.out)?,
        None => None,
    };
    let resumed = match &resume_from {
        Some(dir) => {
            let st = checkpoint::load_state_for(dir, "--resume")?;
            check_resume(cfg, &st, &classes, dir, world)?;
            if run_is_complete(cfg, &st, dir) {
                // `--resume auto` of a finished run (a requeued job that already ended): done.
                say!(
                    "resume: {} already finished its {} epochs; nothing to do (raise --epochs to train further)",
                    run_dir.display(),
                    st.epoch
                );
                return Ok(RunSummary {
                    best_epoch: st.best_epoch.unwrap_or(0),
                    report: None,
                    interrupted: None,
                });
            }
            Some(st)
        }
        None => {
            if cfg.resume.is_some() {
                say!(
                    "resume: no checkpoint in {}; starting a new run",
                    run_dir.join("last").display()
                );
            }
            None
        }
    };

    // ---- run directory: rank 0 alone writes
    if is_main && resumed.is_none() && run_dir.is_dir() {
        // validate() refused an earlier run in --out unless --overwrite (or --resume auto found
        // no checkpoint): its outputs go, so that no later `--resume auto` or reader mixes them
        // with this run's.
        remove_earlier_run(&run_dir)?;
    }
    if is_main && run_dir.is_dir() {
        atomic::remove_stale_temps(&run_dir)?; // left by a process killed in the middle of a write
    }
    let mut tb = None;
    if is_main {
        if let Err(e) = std::fs::create_dir_all(&run_dir) {
            return Err(user_error(format!("cannot create --out {}: {e}", run_dir.display())));
        }
        atomic::write_file(&run_dir.join("config.toml"), cfg.to_toml()?.as_bytes())?;
        let mut w = EventWriter::create(&run_dir)?;
        w.text("config", &format!("```toml\n{}\n```", cfg.to_toml()?), 0)?;
        tb = Some(w);
    }

    // ---- model, optimizer, schedule
    let num_classes = classes.len() as i64;
    let mut model = Model::new(cfg.model, num_classes, device);
    if let (Some(path), None) = (&cfg.pretrained, &resumed) {
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
    if channels_last {
        shim::var_store_to_channels_last(&model.vs)?;
    }
    // Frozen parameters get no gradient: leave them out of the optimizer and the all-reduce.
    let named = model.trainable();
    let no_decay = if cfg.no_bn_weight_decay {
        optim::batch_norm_params(&model.vs.variables().into_keys().collect::<Vec<_>>())
    } else {
        Default::default()
    };
    let mut opt = Optimizer::new(
        cfg,
        &named,
        &optim::Placement {
            head_prefix: model.head_prefix(),
            head_lr_mult: cfg.head_lr_mult,
            no_decay: &no_decay,
        },
    );
    let params: Vec<Tensor> = opt.params().map(|p| p.shallow_clone()).collect();
    let buffers = model.untrained();
    let amp_kind = cfg.amp.autocast_kind(device)?;
    let mut scaler = (amp_kind == Some(Kind::Half)).then(|| amp::GradScaler::new(device, cfg.loss_scale));
    let mut guard = DivergenceGuard::new(device, scaler.is_some());
    let last_good = || {
        let last = cfg.out.join("last");
        if last.is_dir() {
            last.display().to_string()
        } else {
            "none yet".to_string()
        }
    };
    let mut ema = cfg.ema.map(|d| Ema::new(&model, num_classes, d)).transpose()?;

    // ---- where the run starts: from scratch, or exactly where the checkpoint left it
    let (mut start_epoch, mut mid_epoch, mut run) = (0, None, RunState::default());
    if let (Some(dir), Some(st)) = (&resume_from, &resumed) {
        let flag = format!("--resume {}", dir.display());
        model.load_safetensors(&dir.join(checkpoint::MODEL_FILE)).map_err(|e| {
            user_error(format!(
                "{flag}: {e:#} (a damaged checkpoint: resume from another one, e.g. best/ or an epoch-NNNN/ of --keep, with --resume DIR)"
            ))
        })?;
        let opt_file = dir.join(checkpoint::OPTIMIZER_FILE);
        if !opt_file.is_file() {
            return Err(user_error(format!(
                "{flag}: no {} in the checkpoint, so the optimizer cannot continue where it stopped",
                checkpoint::OPTIMIZER_FILE
            )));
        }
        opt.load_state(checkpoint::read_tensors(&opt_file, &flag)?)
            .map_err(|e| user_error(format!("{flag}: {}: {e:#}", checkpoint::OPTIMIZER_FILE)))?;
        if let Some(ema) = ema.as_mut() {
            let f = dir.join(checkpoint::EMA_FILE);
            if f.is_file() {
                ema.model
                    .load_safetensors(&f)
                    .map_err(|e| user_error(format!("{flag}: {e:#}")))?;
            } else {
                say!("resume: the checkpoint has no moving average; --ema starts from the current weights");
                *ema = Ema::new(&model, num_classes, cfg.ema.expect("ema is on"))?;
            }
        }
        if let (Some(s), Some(saved)) = (scaler.as_mut(), &st.scaler) {
            s.restore(saved);
        }
        (start_epoch, mid_epoch, run) = (st.epoch, st.mid_epoch.clone(), RunState::from_checkpoint(st));
        if is_main && st.mid_epoch.is_none() && is_own_last(cfg, dir) {
            catch_up_epoch_outputs(cfg, st)?;
        }
        say!(
            "resume: {} {}, step {} (best {} {:.4} at epoch {})",
            dir.display(),
            match &st.mid_epoch {
                Some(p) => format!("in epoch {} after {} of its steps", st.epoch + 1, p.steps),
                None if st.epoch >= cfg.epochs =>
                    format!("after its last epoch ({}): writing the final report", st.epoch),
                None => format!("at the start of epoch {}", st.epoch + 1),
            },
            st.global_step,
            cfg.monitor.name(),
            st.best_metric.unwrap_or(f64::NAN),
            st.best_epoch.unwrap_or(0)
        );
    }

    // ---- data parallelism: rendezvous, then every replica starts from rank 0's state
    let ddp = match dist {
        Some(d) => {
            let backend = Backend::for_device(device);
            let pg = ProcessGroup::new(
                backend,
                &d.env.master_addr,
                d.env.master_port,
                rank,
                world,
                d.timeout,
                device,
            )?;
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
                d.grad_compress.kind().map(|k| format!(", all-reduce in {k:?}")).unwrap_or_default(),
                if d.sync_bn { ", SyncBatchNorm" } else { "" }
            );
            ddp
        }
        None => Ddp::new(ProcessGroup::single(device), &params, 25.0, crate::dist::ddp::WirePrecision::Off)?,
    };
    let pg = &ddp.pg;
    let sync_bn = dist.is_some_and(|d| d.sync_bn);
    let _sync_bn_guard = (sync_bn && pg.is_distributed()).then(|| crate::model::batchnorm::sync_batch_norm(pg));
    let accum = cfg.accum_steps;
    let micro_per_epoch = train_loader.batches_per_epoch();
    let steps_per_epoch = micro_per_epoch.div_ceil(accum);
    let sched = schedule::LrSchedule::new(cfg, steps_per_epoch);
    let plateau = schedule::Plateau::new(cfg);
    let mixup = cfg.mixup(num_classes).map(Mixup::new).transpose()?;
    let stop = StopRequest::install()?;
    say!(
        "ringtrain: {} ({:.1}M parameters) on {:?}{}, {} classes, {} train / {} val images, {} steps per epoch{}, {} data workers",
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
        if accum > 1 { format!(" ({accum} micro-batches each)") } else { String::new() },
        workers
    );

    let mut warned: std::collections::HashSet<PathBuf> = Default::default();
    let run_start = Instant::now();
    let mut stopped_by: Option<i32> = None;
    for epoch in start_epoch..cfg.epochs {
        // ---- train one epoch (or what is left of it)
        let resumed_pos = mid_epoch.take().unwrap_or_default();
        let t0 = Instant::now();
        let restored = |v: f64| if is_main { v } else { 0.0 };
        let mut loss_sum = Tensor::from(restored(resumed_pos.loss_sum)).to_device(device);
        let mut correct = Tensor::from(restored(resumed_pos.correct)).to_device(device);
        let mut skipped_t = Tensor::from(restored(resumed_pos.skipped_steps))
            .to_kind(Kind::Float)
            .to_device(device);
        let mut seen = restored(resumed_pos.seen) as usize;
        let mut unreadable = if is_main { resumed_pos.unreadable } else { 0 };
        let mut lr = sched.lr_at(run.global_step, &run.plateau);
        let progress = EpochProgress::new(epoch + 1, cfg.epochs, steps_per_epoch, cfg.log_every);
        let mut micro = resumed_pos.steps * accum;
        for batch in train_loader.epoch_from(epoch as u64, micro) {
            let step_in_epoch = micro / accum;
            let k = micro % accum; // position in the accumulation group
            let group = accum.min(micro_per_epoch - step_in_epoch * accum);
            let batch = batch?;
            unreadable += batch.skipped.len();
            warn_once(&mut warned, &batch.skipped);
            let batch = refill(batch, batch_len(&train_loader, micro, rank_batch))?;
            let mut x = normalize.apply(&batch.images);
            let y = normalize.labels(&batch.labels);
            // Randomness inside the step (dropout) depends on the position alone: a resumed
            // run repeats it.
            tch::manual_seed(step_seed(cfg.seed, epoch, micro));
            if k == 0 {
                lr = sched.lr_at(run.global_step, &run.plateau);
                match ddp.owns_grads() {
                    true => ddp.zero_grad(),
                    false => opt.zero_grad()?,
                }
                if world > 1 && !sync_bn {
                    ddp.broadcast_buffers(&buffers)?;
                }
            }
            // Mixup/CutMix on the device; its draws depend on (seed, rank, position) only.
            let soft_targets = match &mixup {
                Some(m) => {
                    let (h, w) = (x.size()[2], x.size()[3]);
                    let position = (epoch * micro_per_epoch + micro) as u64;
                    let p = m.sample(h, w, &mut mix_rng(cfg.seed, rank as u64, position));
                    let (mixed, t) = m.apply(&x, &y, &p);
                    x = mixed;
                    Some(t)
                }
                None => None,
            };
            let (logits, loss) = {
                // Forward and loss under autocast; backward and the step outside, as torch.autocast.
                let _autocast = amp_kind.map(|k| shim::autocast(device, k)).transpose()?;
                let logits = model.forward(&x, true);
                let loss = match &soft_targets {
                    // Label smoothing is inside the soft targets.
                    Some(t) => soft_target_cross_entropy(&logits, t),
                    None => logits.cross_entropy_loss::<Tensor>(&y, None, Reduction::Mean, -100, cfg.label_smoothing),
                };
                (logits, loss.to_kind(Kind::Float))
            };
            // Accumulated micro-batches each count 1/group of the step's gradient.
            let to_backward = if group > 1 {
                &loss / group as f64
            } else {
                loss.shallow_clone()
            };
            match &scaler {
                Some(s) => s.scale_loss(&to_backward).f_backward()?,
                None => to_backward.f_backward()?,
            }
            model.bn_batches += 1;
            micro += 1;
            let bs = y.size()[0] as usize;
            seen += bs;
            tch::no_grad(|| {
                loss_sum += loss.detach() * bs as f64;
                correct += logits.argmax(-1, false).eq_tensor(&y).sum(Kind::Float);
            });
            if k + 1 < group {
                continue; // gradients keep accumulating; no all-reduce until the group's last
            }

            // ---- the optimizer step
            ddp.all_reduce_grads()?;
            let found_inf = match scaler.as_mut() {
                Some(s) => {
                    let grads: Vec<Tensor> = params.iter().map(|p| p.grad()).filter(|g| g.defined()).collect();
                    Some(s.unscale(&grads, pg)?)
                }
                None => None,
            };
            if let Some(max_norm) = cfg.clip_grad_norm {
                let _ = optim::clip_grad_norm(&params, max_norm);
            }
            // An fp16 overflow skips the step on the device: no host synchronisation here.
            opt.step(lr, found_inf.as_ref())?;
            if let Some(s) = scaler.as_mut() {
                s.update();
            }
            if let Some(f) = &found_inf {
                skipped_t += f.sum(Kind::Float);
            }
            if let Some(ema) = ema.as_mut() {
                ema.update(model.bn_batches);
            }
            run.global_step += 1;
            guard.record(run.global_step, &loss, found_inf.as_ref());
            let steps_done = step_in_epoch + 1;
            let loss_now = progress.wants_loss(steps_done).then(|| loss.double_value(&[]));
            if cfg.log_every > 0 && steps_done % cfg.log_every == 0 {
                guard.check(pg, &last_good())?; // on every rank at the same steps: it may all-reduce
            }
            if let (Some(l), Some(tb)) = (loss_now, tb.as_mut()) {
                // The 0-based index of the step just taken, as `epoch * len(loader) + i` in PyTorch scripts.
                tb.scalar("train/loss", l, run.global_step as i64 - 1)?;
                tb.scalar("train/lr", lr, run.global_step as i64 - 1)?;
                if cfg.head_lr_mult != 1.0 {
                    tb.scalar("train/lr_head", lr * cfg.head_lr_mult, run.global_step as i64 - 1)?;
                }
            }
            progress.update(steps_done, seen * world, loss_now, lr);

            // ---- a stop request or a periodic save: checkpoint the position inside the epoch
            let signal = agreed_signal(&stop, pg, world == 1 || run.global_step % 10 == 0)?;
            let periodic =
                cfg.save_every_steps.is_some_and(|n| run.global_step % n == 0) && steps_done < steps_per_epoch;
            if signal.is_some() || periodic {
                guard.check(pg, &last_good())?;
                let v = sum_over_ranks(pg, &epoch_sums(&loss_sum, &correct, seen, &skipped_t, unreadable))?;
                let pos = EpochPosition {
                    steps: steps_done,
                    loss_sum: v[0],
                    correct: v[1],
                    seen: v[2],
                    skipped_steps: v[3],
                    unreadable: v[4] as usize,
                    seconds: resumed_pos.seconds + t0.elapsed().as_secs_f64(),
                };
                if is_main {
                    let st = run.checkpoint_state(cfg, &classes, epoch, Some(pos), &scaler, world);
                    save_checkpoint(&run_dir.join("last"), &model, &st, &opt, &ema)?;
                }
                pg.barrier()?; // no rank leaves before rank 0 has saved
            }
            if let Some(sig) = signal {
                stopped_by = Some(sig);
                break;
            }
        }
        progress.finish();
        if stopped_by.is_some() {
            break;
        }
        guard.check(pg, &last_good())?;
        let train_secs = resumed_pos.seconds + t0.elapsed().as_secs_f64();
        let comm_share = match pg.is_distributed() {
            true => Some(ddp.take_comm_time()?.as_secs_f64() / train_secs),
            false => None,
        };
        // Epoch statistics over all ranks (padding repeats count as seen, as in DDP).
        let t = sum_over_ranks(pg, &epoch_sums(&loss_sum, &correct, seen, &skipped_t, unreadable))?;
        let n = t[2].max(1.0);
        let (train_loss, train_top1) = (t[0] / n, t[1] / n);
        let (seen_all, skipped_steps) = (t[2] as usize, t[3].round() as usize);

        // ---- validate (and the moving average, when kept)
        let ev = eval::evaluate(&model, &val_loader, &normalize, pg)?;
        warn_once(&mut warned, &ev.skipped);
        unreadable += ev.skipped.len();
        let epoch_report = ClassificationReport::new(&classes, &ev.targets, &ev.preds);
        let macro_f1 = epoch_report.macro_avg.f1;
        let ema_ev = ema
            .as_ref()
            .map(|e| eval::evaluate(&e.model, &val_loader, &normalize, pg))
            .transpose()?;
        let row = EpochRow {
            epoch: epoch + 1,
            train_loss,
            train_top1,
            val_loss: ev.loss,
            val_top1: ev.top1,
            val_top5: ev.top5,
            lr,
            seconds: resumed_pos.seconds + t0.elapsed().as_secs_f64(),
            images_per_s: seen_all as f64 / train_secs,
            skipped_steps,
            val_macro_f1: macro_f1,
            ema_val_top1: ema_ev.as_ref().map(|e| e.top1),
        };
        let metric = match cfg.monitor {
            Metric::ValTop1 => ev.top1,
            Metric::ValTop5 => ev.top5,
            Metric::ValLoss => ev.loss,
            Metric::ValMacroF1 => macro_f1,
        };
        let improved = schedule::improves(run.best.map(|b| b.1), metric, cfg.monitor.minimise());
        if improved {
            run.best = Some((epoch + 1, metric));
            run.best_eval = Some(ev.clone());
        }
        let (best_epoch, best_metric) = run.best.expect("set above");
        if cfg.sched == SchedKind::Plateau && plateau.step(&mut run.plateau, metric) {
            say!(
                "ReduceLROnPlateau: {} did not improve for {} epochs; lr now {:.3e}",
                cfg.monitor.name(),
                cfg.plateau_patience + 1,
                run.plateau.lr.unwrap_or(cfg.lr)
            );
        }
        run.history.push(row.clone());

        // ---- checkpoints and metrics (rank 0 alone writes)
        if is_main {
            let st = run.checkpoint_state(cfg, &classes, epoch + 1, None, &scaler, world);
            save_checkpoint(&run_dir.join("last"), &model, &st, &opt, &ema)?;
            if improved {
                save_checkpoint(&run_dir.join("best"), &model, &st, &opt, &ema)?;
            }
            if cfg.keep > 0 {
                keep_epoch_checkpoint(&run_dir, epoch + 1, cfg.keep)?;
            }
            plots::training_curves(&run_dir.join("curves.png"), &run.history)?;
            if cfg.report_every_epoch {
                let text = epoch_report.to_text();
                let path = run_dir.join("reports").join(format!("epoch-{:04}.txt", epoch + 1));
                std::fs::create_dir_all(run_dir.join("reports"))?;
                atomic::write_file(&path, text.as_bytes())?;
                say!("classification report, epoch {}:\n{text}", epoch + 1);
            }
            // Last: a current metrics.csv tells a resumed run that the epoch's outputs are all written.
            metrics_csv::write(&run_dir.join("metrics.csv"), &run.history)?;
        }
        if let Some(tb) = tb.as_mut() {
            let e = (epoch + 1) as i64;
            for (tag, v) in [
                ("epoch/train_loss", train_loss),
                ("epoch/train_top1", train_top1),
                ("epoch/val_loss", ev.loss),
                ("epoch/val_top1", ev.top1),
                ("epoch/val_top5", ev.top5),
                ("epoch/val_macro_f1", macro_f1),
                ("epoch/lr", lr),
                ("epoch/images_per_s", row.images_per_s),
                ("epoch/seconds", row.seconds),
                ("epoch/allreduce_share", comm_share.unwrap_or(0.0)),
                ("epoch/amp_skipped_steps", skipped_steps as f64),
                ("epoch/unreadable_images", unreadable as f64),
            ] {
                tb.scalar(tag, v, e)?;
            }
            if let Some(e2) = &ema_ev {
                tb.scalar("epoch/ema_val_top1", e2.top1, e)?;
            }
            tb.flush()?;
        }
        say!(
            "epoch {}/{} {} | train loss {:.4} top1 {:.2}% | val loss {:.4} top1 {:.2}% top5 {:.2}%{} | lr {:.5} | {:.0} img/s{} | best {} {:.4} (epoch {})",
            epoch + 1,
            cfg.epochs,
            fmt_duration(row.seconds),
            train_loss,
            100.0 * train_top1,
            ev.loss,
            100.0 * ev.top1,
            100.0 * ev.top5,
            ema_ev.as_ref().map(|e| format!(" (ema {:.2}%)", 100.0 * e.top1)).unwrap_or_default(),
            lr,
            row.images_per_s,
            comm_share.map(|c| format!(" (all-reduce {:.1}% of rank 0's time)", 100.0 * c)).unwrap_or_default()
                + &if unreadable > 0 { format!(" | {unreadable} unreadable images skipped") } else { String::new() },
            cfg.monitor.name(),
            best_metric,
            best_epoch
        );
        // A signal that came during validation: the epoch's checkpoint is saved, stop here.
        if let Some(sig) = agreed_signal(&stop, pg, true)? {
            stopped_by = Some(sig);
            break;
        }
        if schedule::should_stop_early(epoch + 1, best_epoch, cfg.early_stop_patience) {
            say!(
                "early stopping: {} has not improved for {} epochs (best {:.4} at epoch {best_epoch})",
                cfg.monitor.name(),
                epoch + 1 - best_epoch,
                best_metric
            );
            break;
        }
    }
    if let Some(sig) = stopped_by {
        say!(
            "stopped by signal {sig}: checkpoint saved in {}; continue with --resume auto",
            run_dir.join("last").display()
        );
        return Ok(RunSummary {
            best_epoch: run.best.map(|b| b.0).unwrap_or(0),
            report: None,
            interrupted: Some(sig),
        });
    }
    let (best_epoch, _) = run.best.expect("at least one epoch ran");
    let best_ev = run.best_eval.expect("kept with best");
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
        "done in {}: best {} at epoch {best_epoch} (val top1 {:.2}%); run directory {}",
        fmt_duration(run_start.elapsed().as_secs_f64()),
        cfg.monitor.name(),
        100.0 * best_ev.top1,
        run_dir.display()
    );
    Ok(RunSummary {
        best_epoch,
        report: Some(report),
        interrupted: None,
    })
}

/// What evolves over the run besides the tensors, and goes into every checkpoint's state.json.
#[derive(Default)]
struct RunState {
    global_step: usize,
    plateau: PlateauState,
    history: Vec<EpochRow>,
    /// (epoch, value of the monitored metric), and that epoch's validation for the final report.
    best: Option<(usize, f64)>,
    best_eval: Option<eval::EvalResult>,
}

impl RunState {
    fn from_checkpoint(st: &CheckpointState) -> Self {
        RunState {
            global_step: st.global_step,
            plateau: st.plateau.clone(),
            history: st.history.clone(),
            best: st.best_epoch.zip(st.best_metric),
            best_eval: st.best_eval.clone(),
        }
    }

    /// The checkpoint state after `epochs_done` epochs, plus `mid_epoch` when inside the next.
    fn checkpoint_state(
        &self,
        cfg: &TrainConfig,
        classes: &[String],
        epochs_done: usize,
        mid_epoch: Option<EpochPosition>,
        scaler: &Option<amp::GradScaler>,
        world: usize,
    ) -> CheckpointState {
        CheckpointState {
            ringtrain_version: env!("CARGO_PKG_VERSION").into(),
            model: cfg.model,
            classes: classes.to_vec(),
            img_size: cfg.img_size,
            eval_resize: cfg.eval_resize(),
            mean: cfg.mean.clone(),
            std: cfg.std.clone(),
            epoch: epochs_done,
            global_step: self.global_step,
            mid_epoch,
            val_top1: self.history.last().map(|r| r.val_top1),
            best_val_top1: self.best_eval.as_ref().map(|e| e.top1),
            best_epoch: self.best.map(|b| b.0),
            best_metric: self.best.map(|b| b.1),
            best_eval: self.best_eval.clone(),
            scaler: scaler.as_ref().map(|s| s.state()),
            plateau: self.plateau.clone(),
            history: self.history.clone(),
            world_size: world,
            config: cfg.clone(),
        }
    }
}

fn save_checkpoint(dir: &Path, model: &Model, st: &CheckpointState, opt: &Optimizer, ema: &Option<Ema>) -> Result<()> {
    checkpoint::save(
        dir,
        model,
        st,
        &checkpoint::Extras {
            optimizer: Some(opt.state_tensors()),
            ema: ema.as_ref().map(|e| &e.model),
        },
    )
}

/// The outputs of an earlier run in `run_dir` that a new run replaces.
fn remove_earlier_run(run_dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(run_dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let is_checkpoint = ["last", "best", "reports"].contains(&name.as_str()) || is_epoch_dir(&name);
        let is_output = name.starts_with("events.out.tfevents.")
            || [
                "report.txt",
                "metrics.json",
                "confusion.csv",
                "confusion.png",
                "metrics.csv",
                "curves.png",
            ]
            .contains(&name.as_str());
        if is_checkpoint && path.is_dir() {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing the earlier run's {}", path.display()))?;
        } else if is_output && path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing the earlier run's {}", path.display()))?;
        }
    }
    Ok(())
}

fn is_epoch_dir(name: &str) -> bool {
    name.len() == 10 && name.starts_with("epoch-") && name[6..].bytes().all(|b| b.is_ascii_digit())
}

/// A kill between an epoch's checkpoint and the files written after it (the `--keep` copy,
/// curves, metrics.csv, written in that order) left those a step behind the checkpoint: bring
/// them level on resume. (A missed per-epoch report is not rewritten: its predictions are gone.)
fn catch_up_epoch_outputs(cfg: &TrainConfig, st: &CheckpointState) -> Result<()> {
    let run_dir = &cfg.out;
    let csv = run_dir.join("metrics.csv");
    let current = std::fs::read_to_string(&csv).is_ok_and(|t| t == metrics_csv::render(&st.history));
    if !current {
        metrics_csv::write(&csv, &st.history)?;
        if !st.history.is_empty() {
            plots::training_curves(&run_dir.join("curves.png"), &st.history)?;
        }
    }
    // Only when the run that saved it kept epochs too: turning --keep on at resume starts keeping
    // from the next epoch.
    let was_kept = cfg.keep > 0 && st.config.keep > 0;
    if was_kept && st.epoch > 0 && !run_dir.join(format!("epoch-{:04}", st.epoch)).is_dir() {
        keep_epoch_checkpoint(run_dir, st.epoch, cfg.keep)?;
    }
    Ok(())
}

/// `--keep N`: the epoch's checkpoint as epoch-NNNN/, and only the newest N of those.
fn keep_epoch_checkpoint(run_dir: &Path, epoch: usize, keep: usize) -> Result<()> {
    checkpoint::copy(&run_dir.join("last"), &run_dir.join(format!("epoch-{epoch:04}")))?;
    let mut kept: Vec<PathBuf> = std::fs::read_dir(run_dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(is_epoch_dir))
        .collect();
    kept.sort();
    for old in kept.iter().take(kept.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

/// This rank's running sums of the epoch, read from the device, in `EpochPosition`'s order:
/// loss sum, correct, seen, skipped steps, unreadable images.
fn epoch_sums(loss_sum: &Tensor, correct: &Tensor, seen: usize, skipped: &Tensor, unreadable: usize) -> [f64; 5] {
    [
        loss_sum.double_value(&[]),
        correct.double_value(&[]),
        seen as f64,
        skipped.double_value(&[]),
        unreadable as f64,
    ]
}

/// Host values summed over ranks (themselves when alone).
fn sum_over_ranks(pg: &ProcessGroup, values: &[f64]) -> Result<Vec<f64>> {
    pg.all_reduce_values(values, ReduceOp::Sum)
}

/// The signal a stop was requested with, agreed by all ranks (any rank's request stops all, at
/// the same step). Under DDP the agreement costs a collective, so callers ask only when `due`
/// (every 10th step, and at epoch ends); alone it is free and always checked.
fn agreed_signal(stop: &StopRequest, pg: &ProcessGroup, due: bool) -> Result<Option<i32>> {
    if !pg.is_distributed() {
        return Ok(stop.signal());
    }
    if !due {
        return Ok(None);
    }
    let agreed = pg.all_reduce_values(&[stop.signal().unwrap_or(0) as f64], ReduceOp::Max)?;
    Ok(match agreed[0] as i32 {
        0 => None,
        s => Some(s),
    })
}

/// The seed of libtorch's generator for micro-batch `micro` of `epoch`.
fn step_seed(seed: u64, epoch: usize, micro: usize) -> i64 {
    use crate::data::loader::mix;
    (mix(mix(mix(seed ^ 0x5eed_5eed) ^ epoch as u64) ^ micro as u64) >> 1) as i64
}

/// Whether the run of checkpoint `dir` has nothing left to do: all epochs trained and, when it is
/// this --out's own `last/`, the final report written. (Killed after the last epoch's checkpoint
/// but before the report, a resumed run only writes the report.)
fn run_is_complete(cfg: &TrainConfig, st: &CheckpointState, dir: &Path) -> bool {
    let trained = st.epoch >= cfg.epochs && st.mid_epoch.is_none();
    trained && !(is_own_last(cfg, dir) && !cfg.out.join("report.txt").is_file())
}

/// Whether `dir` is the `last/` checkpoint of this run's own --out.
fn is_own_last(cfg: &TrainConfig, dir: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    canon(dir).is_some() && canon(dir) == canon(&cfg.out.join("last"))
}

/// A resumed run must train the same model on the same data with the same batch and
/// optimizer; other settings (epochs, schedule, logging) may change, and are listed.
fn check_resume(cfg: &TrainConfig, st: &CheckpointState, classes: &[String], dir: &Path, world: usize) -> Result<()> {
    let c = &st.config;
    let fixed = [
        ("--model", cfg.model.to_string(), c.model.to_string()),
        ("--img-size", cfg.img_size.to_string(), c.img_size.to_string()),
        ("--batch-size", cfg.batch_size.to_string(), c.batch_size.to_string()),
        ("--accum-steps", cfg.accum_steps.to_string(), c.accum_steps.to_string()),
        (
            "--optimizer",
            format!("{:?}", cfg.optimizer),
            format!("{:?}", c.optimizer),
        ),
        ("--seed", cfg.seed.to_string(), c.seed.to_string()),
        (
            "--ema",
            format!("{:?}", cfg.ema.is_some()),
            format!("{:?}", c.ema.is_some()),
        ),
    ];
    for (flag, ours, theirs) in fixed {
        if ours != theirs {
            return Err(user_error(format!(
                "--resume {}: the run was trained with {flag} {theirs}, this command gives {ours}; resume with the same value",
                dir.display()
            )));
        }
    }
    if st.classes != classes {
        return Err(user_error(format!(
            "--resume {}: the checkpoint's {} classes differ from the {} classes under --data",
            dir.display(),
            st.classes.len(),
            classes.len()
        )));
    }
    if run_is_complete(cfg, st, dir) && cfg.resume.as_deref() != Some("auto") {
        return Err(user_error(format!(
            "--resume {}: the run already finished its {} epochs; raise --epochs to train further",
            dir.display(),
            st.epoch
        )));
    }
    let (ours, theirs) = (toml::Table::try_from(cfg)?, toml::Table::try_from(c)?);
    let changed: Vec<String> = ours
        .iter()
        .filter(|(k, v)| !["out", "overwrite"].contains(&k.as_str()) && theirs.get(*k) != Some(v))
        .map(|(k, v)| match theirs.get(k) {
            Some(old) => format!("{k} {old} → {v}"),
            None => format!("{k} = {v}"),
        })
        .collect();
    if !changed.is_empty() {
        say!("resume: changed settings: {}", changed.join(", "));
    }
    if st.world_size != world {
        say!(
            "resume: the run had {} ranks, now {world}: the global batch ({}) and the learning rate are kept; per-rank batches change from {} to {}{}",
            st.world_size,
            cfg.batch_size,
            cfg.batch_size / st.world_size.max(1),
            cfg.batch_size / world,
            if st.mid_epoch.is_some() {
                "; the interrupted epoch continues at the same step, but its remaining batches are drawn from a different split of the epoch among ranks"
            } else {
                ""
            }
        );
    }
    Ok(())
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
