//! The command line: parses (`args`), then hands each command to the library and prints what it
//! returns. Every `train` option can also come from a TOML file (`--config`); flags override the
//! file, and the file the defaults (`TrainConfig::default()`, shown in the help by `defaults`).
mod args;
mod defaults;
mod lr_find;
mod show_batch;
mod torchvision_command;

use std::path::Path;

use anyhow::Result;

use crate::bench::reference;
use crate::config::{self, TrainConfig};
use crate::data::source::Dataset;
use crate::data::tools::demo;
use crate::dist::launcher;
use crate::dist::plan::{self, Plan};
use crate::dist::process_group::nccl_available;
use crate::error::{first_line, is_user_error, user_error};
use crate::infer::evaluate::{self, EvaluateOptions};
use crate::infer::predict::{self, PredictOptions};
use crate::model::{Model, ModelKind};
use crate::report::progress::warn_unreadable;
use crate::shim;
use crate::{bail_user, say};
use args::{
    RecipeCommand,
    BenchArgs, BenchDataArgs, Cli, Command, CompareArgs, ConvertArgs, DemoArgs, EvalArgs, ExportArgs, PackArgs, PredictArgs, SplitArgs, StatsArgs,
    FusedCheckArgs, TraceTableArgs, TrainArgs,
};

fn dispatch(cli: Cli) -> Result<()> {
    crate::report::progress::set_quiet(cli.quiet);
    if cli.version {
        crate::outln!("{}", version());
        return Ok(());
    }
    if let Some(fetch) = cli.command.as_ref().and_then(fetch_args) {
        crate::data::remote::cache::configure(fetch.options());
    }
    match cli.command {
        Some(Command::Train(args)) => train(&args),
        Some(Command::LrFind(args)) => lr_find::run(&args),
        Some(Command::ShowBatch(args)) => show_batch::run(&args),
        Some(Command::Recipe(RecipeCommand::FromTorchvision { out, command })) => recipe_from_torchvision(out.as_deref(), &command),
        Some(Command::Demo(args)) => demo(&args),
        Some(Command::Eval(args)) => eval(&args),
        Some(Command::Predict(args)) => predict(&args),
        Some(Command::Export(args)) => export(&args),
        Some(Command::Compare(args)) => compare(&args),
        Some(Command::Bench(args)) => bench(&args),
        Some(Command::BenchData(args)) => bench_data(&args),
        Some(Command::TraceTable(args)) => trace_table(&args),
        Some(Command::FusedCheck(args)) => fused_check(&args),
        Some(Command::Split(args)) => split(&args),
        Some(Command::Stats(args)) => stats(&args),
        Some(Command::Pack(args)) => pack(&args),
        Some(Command::Models) => {
            models();
            Ok(())
        }
        Some(Command::Convert(args)) => convert(&args),
        Some(Command::Doctor(args)) => crate::doctor::run(args.out.as_deref(), args.data.as_deref()),
        Some(Command::Completions { shell }) => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut defaults::command(), "ringtrain", &mut out);
            crate::report::stdout::bytes(&out);
            Ok(())
        }
        Some(Command::Man) => {
            let mut out = Vec::new();
            clap_mangen::Man::new(defaults::command().version(env!("CARGO_PKG_VERSION"))).render(&mut out)?;
            crate::report::stdout::bytes(&out);
            Ok(())
        }
        None => Err(user_error("no command given; try `ringtrain --help`")),
    }
}

/// The remote data cache's flags of a command that reads data.
fn fetch_args(command: &Command) -> Option<&args::FetchArgs> {
    match command {
        Command::Train(a) => Some(&a.fetch),
        Command::ShowBatch(a) => Some(&a.train.fetch),
        Command::LrFind(a) => Some(&a.train.fetch),
        Command::Eval(a) => Some(&a.source.fetch),
        Command::Predict(a) => Some(&a.fetch),
        Command::Stats(a) => Some(&a.source.fetch),
        Command::Pack(a) => Some(&a.source.fetch),
        Command::BenchData(a) => Some(&a.source.fetch),
        _ => None,
    }
}

/// defaults ← `--config` file ← the flags given.
fn train_config(args: &TrainArgs) -> Result<TrainConfig> {
    let file = args.config.as_deref().map(config::read_toml).transpose()?;
    let flags = toml::Table::try_from(args).map_err(|e| user_error(format!("invalid flags: {e}")))?;
    let mut cfg = config::resolve(file, flags)?;
    cfg.resume = args.resume.clone();
    Ok(cfg)
}

fn train(args: &TrainArgs) -> Result<()> {
    crate::report::stdout::training_command();
    let cfg = train_config(args)?;
    let dist = match plan::plan(&(&args.dist).into(), cfg.device, cfg.sync_bn)? {
        Plan::Launch(spec) => {
            crate::train::lifecycle::run_lock::RunLock::check_free(&cfg.out)?;
            cfg.preflight()?; // reject bad input once, before starting any worker
            let argv: Vec<String> = std::env::args().skip(1).collect();
            let code = launcher::launch(&spec, &argv)?;
            return if code == 0 {
                Ok(())
            } else {
                Err(anyhow::Error::new(ExitCode(code)))
            };
        }
        Plan::Worker(d) => Some(d),
        Plan::Single => None,
    };
    finish_run(crate::train::run(&cfg, dist.as_ref())?)
}

/// The demo's training settings; its flags override them, and it sets data and val to its data set.
const DEMO_RECIPE: &str = include_str!("../../recipes/demo.toml");

/// recipes/demo.toml over the defaults.
fn demo_recipe() -> TrainConfig {
    config::resolve(Some(recipe_table()), toml::Table::new()).expect("recipes/demo.toml is a valid config")
}

fn recipe_table() -> toml::Table {
    DEMO_RECIPE.parse().expect("recipes/demo.toml is valid TOML")
}

/// The demo's recipe ← its flags given; the data set is the caller's to set.
fn demo_config(args: &DemoArgs) -> Result<TrainConfig> {
    let flags = toml::Table::try_from(args).map_err(|e| user_error(format!("invalid flags: {e}")))?;
    let mut cfg = config::resolve(Some(recipe_table()), flags)?;
    if cfg.epochs <= 1 {
        cfg.warmup_epochs = 0.0; // a one-epoch check run: no warm-up to spend it in
    }
    Ok(cfg)
}

fn demo(args: &DemoArgs) -> Result<()> {
    crate::report::stdout::training_command();
    let mut cfg = demo_config(args)?;
    let data = demo::ensure(&cfg.out, args.seed)?;
    cfg.data = Some(data.join("train"));
    cfg.val = Some(data.join("val"));
    finish_run(crate::train::run(&cfg, None)?)
}

/// A training run's end on the command line: the report, or the exit code of the signal that
/// stopped it (its checkpoint is saved).
fn finish_run(summary: crate::train::RunSummary) -> Result<()> {
    if let Some(sig) = summary.interrupted {
        return Err(anyhow::Error::new(ExitCode(128 + sig)));
    }
    if let Some(r) = &summary.report {
        say!(
            "\nclassification report (best epoch {}):\n{}",
            summary.best_epoch,
            r.summary_text(CONSOLE_CLASSES, "report.txt in the run directory")
        );
    }
    Ok(())
}

/// Classes of a report printed whole; beyond, the lowest-F1 ones (the files hold them all).
const CONSOLE_CLASSES: usize = 40;

/// Data worker threads: as given, else the available cores.
fn workers(n: Option<usize>) -> usize {
    n.unwrap_or_else(crate::device::available_cores).max(1)
}

fn eval(args: &EvalArgs) -> Result<()> {
    let e = evaluate::evaluate(&EvaluateOptions {
        checkpoint: args.checkpoint.clone(),
        data: args.source.spec(),
        out: args.out.clone(),
        report: args.report.clone(),
        batch_size: args.infer.batch_size,
        device: args.infer.device.resolve()?,
        workers: workers(args.infer.workers),
        interpolation: args.infer.interpolation,
    })?;
    let ev = &e.result;
    for (p, why) in &ev.unreadable {
        warn_unreadable(p, why);
    }
    if let Some(report) = &e.report {
        say!(
            "{} images ({} unreadable): loss {:.4}, top-1 {:.2}%, top-5 {:.2}%\n\n{}\nreport, metrics.json, predictions.csv, confusion.csv and confusion.png in {}; the page: {}",
            ev.targets.len(),
            ev.unreadable.len(),
            ev.loss,
            100.0 * ev.top1,
            100.0 * ev.top5,
            report.summary_text(CONSOLE_CLASSES, "report.txt"),
            e.out.display(),
            e.page.display()
        );
    }
    Ok(())
}

fn export(args: &ExportArgs) -> Result<()> {
    if args.opset.is_some() && args.format != crate::export::ExportFormat::Onnx {
        bail_user!("--opset is for --format onnx");
    }
    if args.with_resize && args.format != crate::export::ExportFormat::Onnx {
        bail_user!("--with-resize is for --format onnx (a traced TorchScript file keeps the size it was traced at)");
    }
    let s = crate::export::export(&crate::export::ExportOptions {
        checkpoint: args.checkpoint.clone(),
        format: args.format,
        out: args.out.clone(),
        opset: args.opset.unwrap_or(match args.with_resize {
            true => crate::export::RESIZE_OPSET,
            false => crate::export::DEFAULT_OPSET,
        }),
        half: args.half,
        with_preprocess: args.with_preprocess,
        with_resize: args.with_resize,
        softmax: args.softmax,
    })?;
    let field = |k: &str| s.metadata.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str()).unwrap_or("");
    if let Some(why) = &s.not_run {
        crate::report::progress::warn(&format!(
            "{} was not run in ONNX Runtime before it was kept: {why}",
            s.out.display()
        ));
    }
    say!("wrote {} ({}), and {}", s.out.display(), args.format, s.labels.display());
    say!("  input:  {}", field("input"));
    say!("  output: {}", field("output"));
    Ok(())
}

fn predict(args: &PredictArgs) -> Result<()> {
    let s = predict::predict(&PredictOptions {
        checkpoint: args.checkpoint.clone(),
        inputs: args.inputs.iter().chain(&args.data).cloned().collect(),
        out: args.out.clone(),
        topk: args.topk,
        logits: args.logits,
        batch_size: args.infer.batch_size,
        device: args.infer.device,
        workers: workers(args.infer.workers),
        interpolation: args.infer.interpolation,
    })?;
    for (p, e) in &s.unreadable {
        warn_unreadable(p, e);
    }
    const SHOWN: usize = 20;
    let width = s
        .predictions
        .iter()
        .take(SHOWN)
        .map(|p| p.path.display().to_string().len())
        .max()
        .unwrap_or(4)
        .min(70);
    say!("{:<width$}  {:<24} {:>8}", "path", "predicted", "prob");
    for p in s.predictions.iter().take(SHOWN) {
        let path = p.path.display().to_string();
        let path = if path.len() > width {
            format!("...{}", &path[path.len() - width + 3..])
        } else {
            path
        };
        say!(
            "{:<width$}  {:<24} {:>7.2}%",
            path,
            s.classes[p.top[0].0],
            100.0 * p.top[0].1
        );
    }
    if s.predictions.len() > SHOWN {
        say!("... and {} more", s.predictions.len() - SHOWN);
    }
    let acc = s
        .accuracy()
        .map(|(a, n)| format!("; accuracy {:.2}% on {n} labelled images", 100.0 * a))
        .unwrap_or_default();
    let n = s.predictions.len() as f64;
    say!(
        "{} images predicted, {} unreadable{acc}; CSV: {}",
        s.predictions.len(),
        s.unreadable.len(),
        args.out.display()
    );
    say!(
        "{:.1} images/s ({:.2} s), the model alone {:.1} images/s ({:.2} s)",
        n / s.seconds.max(1e-9),
        s.seconds,
        n / s.model_seconds.max(1e-9),
        s.model_seconds
    );
    Ok(())
}

/// `ringtrain compare`: the runs' table and the keys that differ; with --plot, their curves.
fn compare(a: &CompareArgs) -> Result<()> {
    use crate::report::{compare, compare_plot};
    if let Some(plot) = &a.plot {
        // Checked before reading the runs, so a mistyped folder fails at once.
        let dir = plot.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            crate::bail_user!("cannot write --plot {}: {} is not a directory", plot.display(), dir.display());
        }
    }
    let runs = a.runs.iter().map(|d| compare::Run::read(d)).collect::<Result<Vec<_>>>()?;
    crate::outln!("{}\n\n{}", compare::table(&runs), compare::differences(&runs));
    if let Some(plot) = &a.plot {
        compare_plot::validation_curves(plot, &runs)?;
        say!("\nvalidation curves of {} runs in {}", runs.len(), plot.display());
    }
    Ok(())
}

/// `bench --vs-pytorch`: how far ringtrain's two runs around PyTorch's may differ before the
/// ratio is called uncertain.
const DRIFT: f64 = 0.05;

fn bench(a: &BenchArgs) -> Result<()> {
    let device = a.run.device.resolve()?;
    reference::check_step_settings(a.batch_size, a.steps)?;
    if a.profile.is_some() && a.profile_steps == 0 {
        bail_user!("--profile-steps must be at least 1");
    }
    let (steps, window) = reference::timed_windows(a.steps);
    let o = crate::bench::BenchOptions {
        model: a.model,
        batch_size: a.batch_size,
        img_size: a.img_size,
        amp: a.amp.autocast_kind(device)?,
        channels_last: crate::device::channels_last(a.run.channels_last, device),
        device,
        steps,
        warmup: a.warmup,
        window,
        flags: crate::bench::StepFlags {
            cuda_graphs: a.cuda_graphs,
            fused_norm: a.fused_norm,
        },
        profile: a.profile.clone().map(|dir| crate::bench::profile::ProfileOptions {
            dir,
            steps: a.profile_steps,
        }),
    };
    let mem = |b: Option<u64>| {
        b.map(|b| format!(", peak memory {:.2} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default()
    };
    say!(
        "{} batch {} at {}px, {:?}, amp {:?}, channels_last {}{}: {} timed steps in windows of {window}",
        o.model,
        o.batch_size,
        o.img_size,
        o.device,
        o.amp,
        o.channels_last,
        if o.flags.cuda_graphs { ", CUDA graphs" } else { "" },
        o.steps
    );
    let ours = crate::bench::run(&o)?;
    say!(
        "ringtrain: {} img/s{}",
        reference::rate(ours.images_per_s),
        mem(ours.peak_memory_bytes)
    );
    let mut profiled = vec![("ringtrain", ours.profile.clone())];
    if a.run.vs_pytorch {
        let script = reference::script("torch_step.py")?;
        let theirs = crate::bench::run_pytorch(&o, &reference::python(a.run.python.as_deref()), &script)?;
        say!(
            "pytorch:   {} img/s{}",
            reference::rate(theirs.images_per_s),
            mem(theirs.peak_memory_bytes)
        );
        // ringtrain again after PyTorch, so the two sides are timed around the same moment: a
        // device whose speed drifts (a GPU slowing for heat, a shared CPU) shows as two different
        // rates of ringtrain's, and the ratio takes their mean.
        let again = crate::bench::run(&crate::bench::BenchOptions { profile: None, ..o.clone() })?;
        let (first, second) = (ours.images_per_s, again.images_per_s);
        say!("ringtrain again: {} img/s", reference::rate(second));
        say!("ratio ringtrain / pytorch: {:.3}", (first + second) / 2.0 / theirs.images_per_s);
        let moved = (first - second).abs() / first.max(second);
        if moved > DRIFT {
            say!(
                "warning: ringtrain's own rate moved {:.0} % between its runs before and after PyTorch's: the {:?} \
                 changed speed meanwhile (heat, power, other work), and the ratio is uncertain by as much",
                moved * 100.0,
                o.device
            );
        }
        profiled.push(("pytorch", theirs.profile));
    }
    if let Some(p) = &o.profile {
        profile_tables(&p.dir, &profiled)?;
    }
    Ok(())
}

fn trace_table(a: &TraceTableArgs) -> Result<()> {
    use crate::bench::trace_table;
    if !a.labels.is_empty() && a.labels.len() != a.traces.len() {
        bail_user!("--labels names {} columns for {} traces", a.labels.len(), a.traces.len());
    }
    // Columns are named by --labels, else by file name, else (two names alike) by path.
    let names: Vec<_> = a.traces.iter().map(|p| p.file_name()).collect();
    let names_unique = names.iter().collect::<std::collections::HashSet<_>>().len() == names.len();
    let mut read = Vec::new();
    for (i, path) in a.traces.iter().enumerate() {
        let label = match (a.labels.get(i), names[i]) {
            (Some(l), _) => l.clone(),
            (None, Some(name)) if names_unique => name.to_string_lossy().into_owned(),
            _ => path.display().to_string(),
        };
        if !path.is_file() {
            bail_user!("trace file does not exist: {}", path.display());
        }
        read.push((label, trace_table::read(path)?));
    }
    let columns: Vec<_> = read.iter().map(|(l, p)| (l.as_str(), p, None)).collect();
    let (text, rows) = trace_table::report(&columns, a.top);
    say!("{}", text.trim_end());
    if let Some(path) = &a.csv {
        crate::bench::profile::write_csv(path, &rows)?;
    }
    Ok(())
}

/// `bench --profile`: the profiled steps' table, side by side, printed and written to
/// DIR/profile.txt and DIR/profile.csv.
fn profile_tables(dir: &Path, profiled: &[(&str, Option<crate::bench::profile::ProfiledSteps>)]) -> Result<()> {
    use crate::bench::trace_table;
    let mut read = Vec::new();
    for (label, run) in profiled {
        let Some(run) = run else {
            bail_user!("--profile: the {label} run wrote no trace");
        };
        read.push((*label, trace_table::read(&run.trace)?, Some(run.measured_ms)));
    }
    let columns: Vec<_> = read.iter().map(|(l, p, m)| (*l, p, *m)).collect();
    let (table, rows) = trace_table::report(&columns, 15);
    let text = format!("where each step's time goes (libtorch's profiler; {})\n{table}", dir.display());
    say!("{}", text.trim_end());
    crate::bench::profile::write_tables(dir, &text, &rows)
}

fn fused_check(a: &FusedCheckArgs) -> Result<()> {
    let n = crate::bench::fused_check::run(a.device.resolve()?, &a.out)?;
    say!("{n} cases of the fused kernels written to {}", a.out.display());
    Ok(())
}

fn bench_data(a: &BenchDataArgs) -> Result<()> {
    let device = a.run.device.resolve()?;
    reference::check_data_settings(a.batch_size, a.epochs, a.img_size, a.workers)?;
    let o = crate::bench::data::DataBenchOptions {
        data: a.source.spec(),
        img_size: a.img_size,
        batch_size: a.batch_size,
        workers: workers(a.workers),
        epochs: a.epochs,
        device,
        model: a.model,
        amp: a.amp.autocast_kind(device)?.filter(|_| a.model.is_some()),
        channels_last: crate::device::channels_last(a.run.channels_last, device),
        cache: a.cache,
        on_device: a.data_on_device,
        auto_augment: a.auto_augment,
    };
    say!(
        "{} at {}px{}, batch {}, {} workers, {} epochs, {:?}{}",
        o.data.path.display(),
        o.img_size,
        o.auto_augment.map_or(String::new(), |p| format!(" with --auto-augment {p}")),
        o.batch_size,
        o.workers,
        o.epochs,
        o.device,
        o.model
            .as_ref()
            .map(|m| format!(", feeding {m} (amp {:?}, channels_last {})", o.amp, o.channels_last))
            .unwrap_or_else(|| ", loader alone".into())
    );
    let ours = crate::bench::data::run(&o)?;
    say!("ringtrain: {} img/s", reference::rate(ours));
    if a.run.vs_pytorch {
        let script = reference::script("torch_loader.py")?;
        let theirs = crate::bench::data::run_pytorch(&o, &reference::python(a.run.python.as_deref()), &script)?;
        say!("pytorch:   {} img/s", reference::rate(theirs));
        say!("ratio ringtrain / pytorch: {:.3}", ours / theirs);
    }
    Ok(())
}

fn split(a: &SplitArgs) -> Result<()> {
    let counts = crate::data::tools::split::split(&a.data, &a.out, a.val_ratio, a.seed, a.link)?;
    for (class, train, val) in &counts.per_class {
        say!("{class:<28} train {train:>6}  val {val:>6}");
    }
    let (t, v) = counts.per_class.iter().fold((0, 0), |(t, v), c| (t + c.1, v + c.2));
    say!("{t} train and {v} val images in {}", a.out.display());
    Ok(())
}

fn pack(a: &PackArgs) -> Result<()> {
    use crate::data::source::pack::Store;
    use crate::data::tools::pack::{self, PackOptions};
    let started = std::time::Instant::now();
    let o = PackOptions {
        store: a.store,
        max_side: a.max_side,
        workers: workers(a.workers),
    };
    let s = pack::write(a.source.spec(), &a.out, &o)?;
    for (p, e) in &s.unreadable {
        warn_unreadable(p, e);
    }
    say!(
        "packed {} images of {} into {} ({:.1} MB, {}{}) in {:.1} s{}",
        s.images,
        a.source.data.display(),
        a.out.display(),
        s.bytes as f64 / 1e6,
        match a.store {
            Store::Raw => "decoded RGB8",
            Store::Encoded => "the files' bytes",
        },
        a.max_side
            .map(|m| format!(", shorter side at most {m} px"))
            .unwrap_or_default(),
        started.elapsed().as_secs_f64(),
        match s.unreadable.len() {
            0 => String::new(),
            n => format!("; {n} unreadable files left out"),
        }
    );
    Ok(())
}

/// `ringtrain models`: one line per architecture (building each once to count its parameters),
/// with whether timm's hub weights of it load (`hf-hub:`) and whose names its files carry.
fn models() {
    use crate::model::timm;
    crate::outln!(
        "{:<27} {:>12} {:>6}  {:<13} {:>9} {:>8}  {:<7} {}",
        "model", "parameters", "input", "head", "drop-path", "dropout", "hf-hub", "file names"
    );
    let shown = |v: Option<f64>| v.map_or("-".to_string(), |v| v.to_string());
    for &kind in ModelKind::ALL {
        let params = Model::new(kind, 1000, tch::Device::Cpu).num_parameters();
        let hub = timm::kind_of_timm(kind.name()).is_some();
        let names = match (kind.is_timm(), hub) {
            (true, _) => "timm",
            (false, true) => "torchvision's; timm's from hf-hub",
            (false, false) => "torchvision",
        };
        crate::outln!(
            "{:<27} {:>12} {:>6}  {:<13} {:>9} {:>8}  {:<7} {}",
            kind.name(),
            thousands(params),
            kind.default_img_size(),
            kind.head_prefix(),
            shown(kind.default_drop_path()),
            shown(kind.default_dropout()),
            if hub { "yes" } else { "-" },
            names
        );
    }
    crate::outln!(
        "\ntimm's weights on the Hugging Face hub (--pretrained hf-hub:ORG/NAME, as hf-hub:timm/convnext_tiny.fb_in22k_ft_in1k): \
         the architectures marked yes, NAME being the architecture and the weights' tag; their config.json sets the input size, \
         resize, interpolation, mean and std. A run from them writes timm's tensor names, which timm.create_model(NAME, \
         num_classes=K) loads strictly."
    );
    crate::outln!("\ntorchvision's ImageNet weights (--pretrained torchvision:NAME; NAME alone is the default, *):");
    crate::outln!("{:<46} {:>6} {:>7} {:>7}  {}", "name", "input", "resize", "top-1", "resize filter");
    for w in crate::model::weights::torchvision::WEIGHTS {
        let name = format!("{}.{}{}", w.model, w.variant, if w.default { " *" } else { "" });
        crate::outln!(
            "{:<46} {:>6} {:>7} {:>7.2}  {}",
            name,
            w.crop,
            w.resize,
            w.top1,
            format!("{:?}", w.interpolation).to_lowercase()
        );
    }
}

/// `ringtrain convert`: any weights to one safetensors file with torchvision's names.
fn convert(a: &ConvertArgs) -> Result<()> {
    if let Some(m) = a.model {
        crate::model::weights::check_model_matches(&a.input, m)?;
    }
    let mut file = a.input.read(a.pretrained_key.as_deref())?;
    if let Some(kind) = a.model.or(a.input.model()) {
        // The same matching as --pretrained, against the architecture at 1000 classes.
        let mut model = Model::new(kind, 1000, tch::Device::Cpu);
        let r = model.load_pretrained(&file.weights, &a.input.to_string(), false)?;
        if !r.missing.is_empty() {
            crate::bail_user!("{}: {kind} also needs {}", a.input, r.missing.join(", "));
        }
        if let Some(p) = r.prefix {
            say!("every name began with {p}, taken off");
            file.weights = crate::model::weights::without_prefix(&file.weights, &p);
        }
    }
    let out = a.out.as_ref().or(a.out_positional.as_ref()).expect("clap requires one of them");
    crate::atomic::write_file_by_path(out, |tmp| {
        crate::model::weights::write_tensors(file.weights.iter().map(|(k, t)| (k.as_str(), t)), tmp)
            .map_err(|e| user_error(format!("cannot write {} ({})", out.display(), first_line(&e.to_string()))))
    })?;
    let from = match &file.key {
        Some(k) => format!("{} [{k}]", file.path.display()),
        None => file.path.display().to_string(),
    };
    say!("{} tensors from {from} written to {}", file.weights.len(), out.display());
    if !file.others.is_empty() {
        say!("the checkpoint also holds {} (--pretrained-key picks one)", file.others.join(", "));
    }
    Ok(())
}

/// 25557032 → "25,557,032".
fn thousands(n: i64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn stats(a: &StatsArgs) -> Result<()> {
    let s = crate::data::tools::stats::pixel_stats(&Dataset::open(a.source.spec(), "--data")?)?;
    for (p, e) in &s.unreadable {
        warn_unreadable(p, e);
    }
    let f = |v: [f64; 3]| format!("{:.6},{:.6},{:.6}", v[0], v[1], v[2]);
    say!(
        "{} images, {} pixels ({} unreadable)",
        s.images,
        s.pixels,
        s.unreadable.len()
    );
    say!("mean {}\nstd  {}", f(s.mean), f(s.std));
    say!("ringtrain train ... --mean {} --std {}", f(s.mean), f(s.std));
    say!(
        "transforms.Normalize(mean=[{}], std=[{}])",
        f(s.mean).replace(',', ", "),
        f(s.std).replace(',', ", ")
    );
    Ok(())
}

fn version() -> String {
    let mut s = format!(
        "ringtrain {}\nlibtorch {}",
        env!("CARGO_PKG_VERSION"),
        shim::torch_version()
    );
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    s += &format!(
        "\nbuilt with: CUDA {}, NCCL {}",
        yes_no(shim::built_with_cuda()),
        yes_no(nccl_available())
    );
    match shim::cuda_version() {
        Some(v) => s += &format!("\nCUDA {v} ({} device(s) visible)", tch::Cuda::device_count()),
        None => s += "\nCUDA not available",
    }
    if let Some(v) = shim::cudnn_version() {
        s += &format!("\ncuDNN {v}");
    }
    s += &format!("\nfused kernels (--fused-norm): {}", crate::model::fused::describe());
    s
}

/// The launcher's exit code, passed through `main` without another message.
#[derive(Debug)]
struct ExitCode(i32);

impl std::fmt::Display for ExitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "workers failed (exit code {})", self.0)
    }
}

impl std::error::Error for ExitCode {}

/// Runs the CLI; returns the process exit code (2 for user mistakes, 1 for other failures).
pub fn main() -> i32 {
    // A file-size limit (ulimit -f) then fails the write with EFBIG, which ends in a clear error
    // with the previous checkpoint intact, instead of killing the process with SIGXFSZ.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // A bug still ends in one line that says where, not a backtrace (RUST_BACKTRACE=1 shows it).
    if std::env::var_os("RUST_BACKTRACE").is_none() {
        crate::error::report_panics_in_one_line();
    }
    let cli = match defaults::parse_args() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("{}", args::one_line_usage_error(&e.to_string()));
            return 2;
        }
        Err(e) => e.exit(), // --help
    };
    // libtorch's warnings stay off, but for the sync debug mode, whose warnings are the point.
    if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() && !crate::device::sync_debug_requested() {
        shim::set_torch_log_level(3);
    }
    let result = dispatch(cli);
    crate::data::remote::cache::remove_temporary();
    match result {
        Ok(()) => 0,
        Err(e) if e.is::<ExitCode>() => e.downcast_ref::<ExitCode>().map(|c| c.0).unwrap_or(1),
        Err(e) if is_user_error(&e) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            // A collective that failed because a peer hung: the watchdog names the peer first.
            eprintln!("error: {}", crate::dist::watchdog::explain(&first_line(&format!("{e:#}"))));
            1
        }
    }
}

/// `recipe from-torchvision`: the configuration, checked as train would read it, to --out or
/// standard output; what was left behind also to standard error.
fn recipe_from_torchvision(out: Option<&std::path::Path>, command: &[String]) -> Result<()> {
    let t = torchvision_command::translate(command)?;
    let text = torchvision_command::to_toml(&t, &command.join(" "));
    let table = config::parse_toml(&text, std::path::Path::new("the made configuration"))?;
    let mut cfg = config::resolve(Some(table), toml::Table::new())?;
    // A recipe leaves --data to the run; every other value is checked as train checks it.
    cfg.data.get_or_insert_with(|| std::path::PathBuf::from("DATA"));
    cfg.check()?;
    for d in &t.dropped {
        crate::report::progress::warn(&format!("not carried over: {d}"));
    }
    match out {
        Some(path) => {
            crate::atomic::write_file(path, text.as_bytes())?;
            say!("{} ({} settings, {} flags not carried over)", path.display(), t.settings.len(), t.dropped.len());
        }
        None => print!("{text}"),
    }
    Ok(())
}
