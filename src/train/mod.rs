//! The training run, top to bottom: data → model → optimizer → epochs of (train, validate,
//! checkpoint, metrics) → the best epoch's classification report.
pub mod context;
pub mod dataset;
pub mod first_batch;
pub mod lifecycle;
pub mod lr_find;
pub mod reporter;
pub mod step;

use anyhow::Result;

use crate::config::TrainConfig;
use crate::dist::DistSetup;
use crate::report::classification::ClassificationReport;
use context::RankContext;
use dataset::TrainData;
use lifecycle::data_record::{DataRecord, Recording};
use lifecycle::resume::Resume;
use lifecycle::run_dir::RunDir;
use lifecycle::run_lock::RunLock;
use lifecycle::sample_log::SampleLog;
use lifecycle::signals::StopRequest;
use reporter::Reporter;
use step::meter::EpochMeter;
use step::trainer::Trainer;

pub struct RunSummary {
    pub best_epoch: usize,
    /// The classification report of the best epoch's validation (None when interrupted).
    pub report: Option<ClassificationReport>,
    /// The signal that stopped the run early (its checkpoint is saved).
    pub interrupted: Option<i32>,
}

/// Trains as described by `cfg`: alone, or as one rank of a data-parallel job (`dist`).
pub fn run(cfg: &TrainConfig, dist: Option<&DistSetup>) -> Result<RunSummary> {
    // The rank that writes the run directory holds it (a second run into it is refused).
    let writes = dist.is_none_or(|d| d.env.rank == 0);
    if writes {
        RunLock::check_free(&cfg.out)?; // before preflight calls a live run's outputs finished
    }
    cfg.preflight()?;
    let ctx = RankContext::new(cfg, dist)?;
    let recorded = DataRecord::of_resumed_run(cfg)?;
    let data = TrainData::load(cfg, &ctx, recorded.as_ref())?;
    // Taken once the data is known good (a rejected run leaves no directory behind), before
    // anything in the run directory is read or written.
    let _held = writes.then(|| RunLock::acquire(&cfg.out)).transpose()?;
    let resume = Resume::find(cfg, &data.classes, ctx.world())?;
    if let Some(done) = resume.finished(cfg) {
        return Ok(done);
    }
    let run_dir = RunDir::prepare(cfg, &data.classes, &ctx, resume.is_new_run())?;
    if resume.is_new_run() {
        run_dir.write_first_batch(|| first_batch::png(cfg, &data, ctx.pg.rank))?;
    }
    // The data it starts with, recorded for a later resume while the first steps run.
    let record = ctx.is_main() && (resume.is_new_run() || recorded.is_none());
    let _recording = Recording::start_if(record, &run_dir.path, data.train.samples(), data.val.samples());
    let pretrained = cfg.pretrained.as_ref().filter(|_| resume.is_new_run());
    let (classes, steps_per_epoch) = (data.num_classes(), data.steps_per_epoch());
    let mut t = Trainer::new(cfg, classes, steps_per_epoch, ctx.pg.clone(), ctx.ddp_options(), pretrained)?;
    let mut state = resume.restore_into(&mut t, cfg, &run_dir)?;
    let _sync_bn = ctx.sync_batch_norm(cfg);
    let resume_at = (state.first_epoch, state.mid_epoch.as_ref().map_or(0, |m| m.steps));
    let mut sample_log = cfg
        .log_samples
        .then(|| SampleLog::open(&run_dir.path, ctx.pg.rank, ctx.world(), resume_at, ctx.is_main()))
        .transpose()?;
    let mut out = Reporter::new(cfg, &ctx, &run_dir, &t, &data)?;
    let stop = StopRequest::install(cfg.requeue)?;
    for epoch in state.first_epoch..cfg.epochs {
        let mut meter = EpochMeter::start(state.start_epoch(t.lr(&state)), t.pg());
        out.start_epoch(epoch, steps_per_epoch);
        for batch in data.train_from(epoch, meter.steps) {
            let batch = batch?;
            let _syncs = crate::device::sync_warnings(t.device(), epoch > state.first_epoch);
            meter.add_unreadable(batch.unreadable);
            if let Some(log) = &mut sample_log {
                log.add(batch.indices.iter().map(|&i| data.train.samples().name(i)));
            }
            if !t.step(&batch.x, &batch.y, batch.pos, &mut state, &mut meter)? {
                continue; // gradients keep accumulating; no all-reduce until the group's last
            }
            if let Some(log) = &mut sample_log {
                log.step_done(epoch, meter.steps - 1)?;
            }
            // ---- training ends here; what follows reads, logs and saves
            if cfg.log_every > 0 && meter.steps % cfg.log_every == 0 {
                t.check_divergence(&run_dir.last_good())?; // every rank at the same steps
            }
            out.step(&t, &state, &meter)?;
            let agreed = stop.agreed(t.pg(), state.global_step % 10 == 0, run_dir.minutes_due())?;
            if agreed.signal.is_some() || state.save_due(cfg, agreed.save, meter.steps, steps_per_epoch) {
                run_dir.save_position(&t, &state, &meter, epoch)?;
            }
            if let Some(sig) = agreed.signal {
                return Ok(out.interrupted(&state, &run_dir, sig, stop.requeue(ctx.is_main())));
            }
        }
        out.end_steps();
        t.check_divergence(&run_dir.last_good())?;
        let train = meter.totals(t.pg())?;
        let comm_share = t.comm_share(train.seconds)?;
        let val = data.validate(&t)?;
        let improved = state.end_epoch(cfg, epoch, &train, &val, meter.seconds());
        run_dir.end_epoch(&t, &state, improved, &val)?;
        out.epoch(&state, &train, &val, comm_share)?;
        // A signal that came during validation: the epoch's checkpoint is saved, stop here.
        if let Some(sig) = stop.agreed(t.pg(), true, false)?.signal {
            return Ok(out.interrupted(&state, &run_dir, sig, stop.requeue(ctx.is_main())));
        }
        if state.should_stop_early(cfg) {
            break;
        }
    }
    out.finish(&state, &run_dir)
}
