//! torchvision's reference command line (`references/classification/train.py`, as users paste
//! it, launcher included) as ringtrain's configuration: every flag of train.py given its meaning
//! in ringtrain's settings, train.py's own defaults written out where ringtrain's differ (its
//! step schedule, 90 epochs, fp32, 224/256 crops), its per-process batch made global, and every
//! flag that cannot be carried over named with why.
use crate::bail_user;
use anyhow::Result;
use toml::Value;

/// The configuration, its notes, and what was left behind.
pub struct Translation {
    /// (key, value, the torchvision flag it comes from), in the order written.
    pub settings: Vec<(String, Value, String)>,
    /// Processes the launcher starts (per node × nodes): torchvision's batch is per process.
    pub world: usize,
    /// Where a carried flag's meaning shifts, one line each.
    pub notes: Vec<String>,
    /// Flags not carried over, each with why.
    pub dropped: Vec<String>,
}

/// train.py's flags that take no value.
const SWITCHES: [&str; 9] = [
    "--cache-dataset",
    "--sync-bn",
    "--test-only",
    "--amp",
    "--model-ema",
    "--use-deterministic-algorithms",
    "--ra-sampler",
    "--use-v2",
    "--distributed",
];

/// train.py's flags that take a value, with their short forms.
const VALUED: [&str; 47] = [
    "--data-path", "--model", "--device", "-b", "--batch-size", "--epochs", "-j", "--workers", "--opt", "--lr",
    "--momentum", "--wd", "--weight-decay", "--norm-weight-decay", "--bias-weight-decay",
    "--transformer-embedding-decay", "--label-smoothing", "--mixup-alpha", "--cutmix-alpha", "--lr-scheduler",
    "--lr-warmup-epochs", "--lr-warmup-method", "--lr-warmup-decay", "--lr-step-size", "--lr-gamma", "--lr-min",
    "--print-freq", "--output-dir", "--resume", "--start-epoch", "--auto-augment", "--ra-magnitude",
    "--augmix-severity", "--random-erase", "--world-size", "--dist-url", "--model-ema-steps", "--model-ema-decay",
    "--interpolation", "--val-resize-size", "--val-crop-size", "--train-crop-size", "--clip-grad-norm", "--ra-reps",
    "--weights", "--backend", "--policy-magnitude",
];

/// The launchers' own options that take a value (torchrun's and torch.distributed.launch's).
fn launcher_value(flag: &str) -> bool {
    let f = flag.trim_start_matches('-').replace('-', "_");
    [
        "nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint",
        "rdzv_id", "rdzv_conf", "max_restarts", "monitor_interval", "start_method", "role", "log_dir", "redirects",
        "tee", "local_addr", "n_nodes", "local_ranks_filter",
    ]
    .contains(&f.as_str())
}

/// The words of a pasted command: the shell's, or one string split at white space.
fn words(args: &[String]) -> Vec<String> {
    args.iter()
        .flat_map(|a| a.split_whitespace().map(String::from).collect::<Vec<_>>())
        .filter(|w| w != "\\")
        .collect()
}

/// train.py's flags as (flag, value), `--flag=value` split; `-b`, `-j` and `--wd` named as their
/// long forms.
fn train_py_flags(words: &[String]) -> Result<Vec<(String, Option<String>)>> {
    let mut out = Vec::new();
    let mut it = words.iter().peekable();
    while let Some(w) = it.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f.to_string(), Some(v.to_string())),
            _ => (w.clone(), None),
        };
        if !flag.starts_with('-') {
            bail_user!("'{w}' is not a flag of torchvision's train.py (a value without its flag?)");
        }
        let long = match flag.as_str() {
            "-b" => "--batch-size".to_string(),
            "-j" => "--workers".to_string(),
            "--wd" => "--weight-decay".to_string(),
            f => f.replace('_', "-"),
        };
        let value = match (SWITCHES.contains(&long.as_str()), inline) {
            (true, None) => None,
            (true, Some(v)) => bail_user!("{flag} of torchvision's train.py takes no value, got '{v}'"),
            (false, Some(v)) => Some(v),
            (false, None) if VALUED.contains(&long.as_str()) => match it.next() {
                Some(v) => Some(v.clone()),
                None => bail_user!("{flag} of torchvision's train.py needs a value"),
            },
            // Unknown: keep its value if one follows, to name it whole.
            (false, None) => it.next_if(|v| !v.starts_with("--")).cloned(),
        };
        out.push((long, value));
    }
    Ok(out)
}

/// The launcher's part of the command (torchrun, `python -m torch.distributed.run|launch`, or
/// `python`) up to train.py: the processes it starts, and train.py's words after it.
fn split_launcher(words: &[String]) -> Result<(Option<usize>, Vec<String>, Vec<String>)> {
    let mut notes = Vec::new();
    let (mut per_node, mut nodes, mut launched) = (1usize, 1usize, false);
    let mut i = 0;
    // Environment assignments (CUDA_VISIBLE_DEVICES=0,1 ...) before the command.
    while i < words.len() && words[i].contains('=') && !words[i].starts_with('-') {
        notes.push(format!("{}: set it in the environment of ringtrain's command", words[i]));
        i += 1;
    }
    let Some(script) = words.iter().position(|w| w.ends_with(".py")) else {
        // Only train.py's flags: one process, as `python train.py` runs.
        return Ok((None, words[i..].to_vec(), notes));
    };
    if !words[script].ends_with("train.py") {
        bail_user!("{} is not torchvision's references/classification/train.py: recipe from-torchvision takes that script's command", words[script]);
    }
    let mut k = i;
    while k < script {
        let w = &words[k];
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (w.clone(), None),
        };
        if w.ends_with("torchrun") || w.ends_with("torch.distributed.run") || w.ends_with("torch.distributed.launch") {
            launched = true;
        } else if flag.starts_with('-') && launcher_value(&flag) {
            let v = match inline {
                Some(v) => v,
                None => {
                    k += 1;
                    words.get(k).cloned().unwrap_or_default()
                }
            };
            match flag.trim_start_matches('-').replace('-', "_").as_str() {
                "nproc_per_node" => match v.parse() {
                    Ok(n) => per_node = n,
                    Err(_) => bail_user!("{flag} {v}: give the number of processes per node ('gpu' or 'auto' do not say how many)"),
                },
                "nnodes" | "n_nodes" => match v.parse() {
                    Ok(n) => nodes = n,
                    Err(_) => bail_user!("{flag} {v}: give a fixed number of nodes (an elastic range does not say the batch)"),
                },
                _ => notes.push(format!("{flag}: ringtrain's launcher finds its peers itself (--master-addr, --master-port where needed)")),
            }
        }
        k += 1;
    }
    let world = launched.then_some(per_node * nodes);
    Ok((world, words[script + 1..].to_vec(), notes))
}

/// The ringtrain configuration of a pasted torchvision command.
pub fn translate(args: &[String]) -> Result<Translation> {
    let words = words(args);
    if words.is_empty() {
        bail_user!("recipe from-torchvision: give torchvision's train.py command after --");
    }
    let (launched, tail, launcher_notes) = split_launcher(&words)?;
    let world = launched.unwrap_or(1);
    let flags = train_py_flags(&tail)?;
    let given = |f: &str| flags.iter().rev().find(|(k, _)| k == f).map(|(_, v)| v.clone());
    let value = |f: &str, default: &str| given(f).flatten().unwrap_or_else(|| default.to_string());
    let switch = |f: &str| given(f).is_some();
    let num = |f: &str, default: &str| -> Result<f64> {
        let v = value(f, default);
        v.parse().map_err(|_| crate::error::user_error(format!("{f} {v}: not a number")))
    };
    let int = |f: &str, default: &str| -> Result<i64> {
        let v = value(f, default);
        v.parse().map_err(|_| crate::error::user_error(format!("{f} {v}: not a whole number")))
    };
    let (mut settings, mut notes, mut dropped) = (Vec::new(), launcher_notes, Vec::new());
    let mut set = |key: &str, v: Value, from: &str| settings.push((key.to_string(), v, from.to_string()));

    // The data: train.py reads DATA/train and DATA/val.
    match given("--data-path").flatten() {
        Some(dir) => {
            let dir = dir.trim_end_matches('/');
            set("data", Value::String(format!("{dir}/train")), "--data-path (its train/)");
            set("val", Value::String(format!("{dir}/val")), "--data-path (its val/)");
        }
        None => notes.push("no --data-path: give --data DIR/train --val DIR/val when training".into()),
    }
    let model = value("--model", "resnet18");
    match model.parse::<crate::model::ModelKind>() {
        Ok(_) => set("model", Value::String(model.clone()), "--model"),
        Err(_) => dropped.push(format!("--model {model}: ringtrain does not build it (ringtrain models lists what it does)")),
    }
    if let Some(Some(w)) = given("--weights") {
        // ResNet50_Weights.IMAGENET1K_V2: the model's published weights by their variant.
        let variant = w.rsplit('.').next().unwrap_or(&w);
        set("pretrained", Value::String(format!("torchvision:{model}.{variant}")), "--weights");
    }
    // torchvision's batch is per process; ringtrain's the global one.
    let per_process = int("--batch-size", "32")?;
    set("batch_size", Value::Integer(per_process * world as i64), "--batch-size (per process) × processes");
    set("epochs", Value::Integer(int("--epochs", "90")?), "--epochs");
    // Data workers and logging: ringtrain's own defaults unless the command sets them.
    if given("--workers").is_some() {
        set("workers", Value::Integer(int("--workers", "16")?), "--workers");
    }
    if given("--print-freq").is_some() {
        set("log_every", Value::Integer(int("--print-freq", "10")?), "--print-freq");
    }

    let opt = value("--opt", "sgd").to_lowercase();
    match opt.as_str() {
        o if o.starts_with("sgd") => {
            set("optimizer", Value::String("sgd".into()), "--opt");
            set("momentum", Value::Float(num("--momentum", "0.9")?), "--momentum");
            set("nesterov", Value::Boolean(o.contains("nesterov")), "--opt");
        }
        "rmsprop" => {
            // train.py's RMSprop: torch's, with its own alpha and eps.
            set("optimizer", Value::String("rmsprop".into()), "--opt");
            set("momentum", Value::Float(num("--momentum", "0.9")?), "--momentum");
            set("rmsprop_alpha", Value::Float(0.9), "--opt rmsprop (train.py's alpha)");
            set("rmsprop_eps", Value::Float(0.0316), "--opt rmsprop (train.py's eps)");
        }
        "adamw" => set("optimizer", Value::String("adamw".into()), "--opt"),
        o => bail_user!("--opt {o}: torchvision's train.py takes sgd, sgd_nesterov, rmsprop or adamw"),
    }
    set("lr", Value::Float(num("--lr", "0.1")?), "--lr");
    set("weight_decay", Value::Float(num("--weight-decay", "1e-4")?), "--weight-decay");
    for (flag, key) in [("--norm-weight-decay", "norm_weight_decay"), ("--bias-weight-decay", "bias_weight_decay")] {
        if given(flag).is_some() {
            set(key, Value::Float(num(flag, "0")?), flag);
        }
    }
    if let Some(v) = given("--transformer-embedding-decay") {
        dropped.push(format!(
            "--transformer-embedding-decay {}: no setting of its own (torchvision's keys name Swin's and MaxViT's embeddings; --no-norm-bias-decay leaves ViT's position embedding and class token undecayed with every norm and bias)",
            v.unwrap_or_default()
        ));
    }
    set("label_smoothing", Value::Float(num("--label-smoothing", "0")?), "--label-smoothing");
    let (mixup_alpha, cutmix_alpha) = (num("--mixup-alpha", "0")?, num("--cutmix-alpha", "0")?);
    set("mixup_alpha", Value::Float(mixup_alpha), "--mixup-alpha");
    set("cutmix_alpha", Value::Float(cutmix_alpha), "--cutmix-alpha");
    if mixup_alpha > 0.0 || cutmix_alpha > 0.0 {
        // RandomChoice of the two, each always applied: switch 0.5, prob 1 (ringtrain's defaults).
        set("mix_style", Value::String("torchvision".into()), "train.py's RandomMixUp/RandomCutMix (roll by one)");
    }

    // The schedule: train.py's default is StepLR(30, 0.1), stepped once an epoch.
    let sched = value("--lr-scheduler", "steplr").to_lowercase();
    match sched.as_str() {
        "steplr" => {
            set("sched", Value::String("step".into()), "--lr-scheduler steplr");
            set("step_size", Value::Integer(int("--lr-step-size", "30")?), "--lr-step-size");
            set("gamma", Value::Float(num("--lr-gamma", "0.1")?), "--lr-gamma");
        }
        "cosineannealinglr" => {
            set("sched", Value::String("cosine".into()), "--lr-scheduler cosineannealinglr");
            set("eta_min", Value::Float(num("--lr-min", "0")?), "--lr-min");
        }
        // ExponentialLR(gamma) is StepLR(1, gamma), warm-up or not (both count from its end).
        "exponentiallr" => {
            set("sched", Value::String("step".into()), "--lr-scheduler exponentiallr (StepLR with step 1)");
            set("step_size", Value::Integer(1), "--lr-scheduler exponentiallr");
            set("gamma", Value::Float(num("--lr-gamma", "0.1")?), "--lr-gamma");
        }
        s => bail_user!("--lr-scheduler {s}: torchvision's train.py takes steplr, cosineannealinglr or exponentiallr"),
    }
    if sched != "cosineannealinglr" && given("--lr-min").is_some() {
        dropped.push("--lr-min: train.py uses it with cosineannealinglr only".into());
    }
    let warmup = num("--lr-warmup-epochs", "0")?;
    set("warmup_epochs", Value::Float(warmup), "--lr-warmup-epochs");
    if warmup > 0.0 {
        let method = value("--lr-warmup-method", "constant").to_lowercase();
        if method != "linear" && method != "constant" {
            bail_user!("--lr-warmup-method {method}: torchvision's train.py takes linear or constant");
        }
        set("lr_warmup_method", Value::String(method), "--lr-warmup-method");
        set("lr_warmup_decay", Value::Float(num("--lr-warmup-decay", "0.01")?), "--lr-warmup-decay");
    }
    // train.py steps its scheduler once an epoch.
    set("sched_interval", Value::String("epoch".into()), "train.py's lr_scheduler.step() once an epoch");

    // The images: train.py's crops and filter, written out (ringtrain's follow the model).
    set("img_size", Value::Integer(int("--train-crop-size", "224")?), "--train-crop-size");
    set("val_crop_size", Value::Integer(int("--val-crop-size", "224")?), "--val-crop-size");
    set("eval_resize", Value::Integer(int("--val-resize-size", "256")?), "--val-resize-size");
    set("interpolation", Value::String(value("--interpolation", "bilinear").to_lowercase()), "--interpolation");
    if let Some(Some(policy)) = given("--auto-augment") {
        if !["ta_wide", "ra", "augmix", "imagenet", "cifar10", "svhn"].contains(&policy.as_str()) {
            bail_user!(
                "--auto-augment {policy}: torchvision's train.py takes ta_wide, ra, augmix, imagenet, cifar10 or svhn"
            );
        }
        set("auto_augment", Value::String(policy.clone()), "--auto-augment");
        match policy.as_str() {
            "ra" => set("ra_magnitude", Value::Integer(int("--ra-magnitude", "9")?), "--ra-magnitude"),
            "augmix" => set("augmix_severity", Value::Integer(int("--augmix-severity", "3")?), "--augmix-severity"),
            _ => {}
        }
    }
    if let Some(v) = given("--policy-magnitude") {
        dropped.push(format!("--policy-magnitude {}: not a flag of train.py (a fork's)", v.unwrap_or_default()));
    }
    set("random_erasing", Value::Float(num("--random-erase", "0")?), "--random-erase");
    if switch("--ra-sampler") {
        match launched {
            Some(_) => {
                set("ra_sampler", Value::Boolean(true), "--ra-sampler");
                set("ra_reps", Value::Integer(int("--ra-reps", "3")?), "--ra-reps");
            }
            // train.py takes its RASampler only when distributed.
            None => dropped.push("--ra-sampler: train.py run without a launcher is not distributed and ignores it".into()),
        }
    }
    if launched.is_some() {
        // Distributed, train.py shuffles with DistributedSampler or RASampler, both seeded 0 + epoch.
        set("torch_sampler_seed", Value::Integer(0), "train.py's DistributedSampler/RASampler order (seed 0)");
    }
    if let Some(v) = given("--clip-grad-norm").flatten() {
        set("clip_grad_norm", Value::Float(num("--clip-grad-norm", &v)?), "--clip-grad-norm");
    }
    // Precision: train.py trains in fp32 unless --amp (fp16 autocast with a GradScaler).
    set("amp", Value::String(if switch("--amp") { "fp16" } else { "off" }.into()), "--amp");
    if switch("--model-ema") {
        set("model_ema", Value::Boolean(true), "--model-ema");
        set("model_ema_steps", Value::Integer(int("--model-ema-steps", "32")?), "--model-ema-steps");
        set("model_ema_decay", Value::Float(num("--model-ema-decay", "0.99998")?), "--model-ema-decay");
    }
    if switch("--sync-bn") {
        set("sync_bn", Value::Boolean(true), "--sync-bn");
    }
    if switch("--use-deterministic-algorithms") {
        set("deterministic", Value::Boolean(true), "--use-deterministic-algorithms");
    }
    if let Some(Some(dir)) = given("--output-dir") {
        set("out", Value::String(dir), "--output-dir");
    }

    for (flag, value) in &flags {
        let why = match flag.as_str() {
            "--device" => "ringtrain takes the GPUs there are (--device to choose)",
            "--resume" => "ringtrain resumes a run with --resume auto (or a run directory)",
            "--start-epoch" => "a resumed ringtrain run knows its epoch",
            "--cache-dataset" => "nothing to cache: ringtrain lists a folder in a moment (packs and the RAM cache decode once)",
            "--test-only" => "use ringtrain eval on a checkpoint",
            "--world-size" | "--dist-url" | "--distributed" => "ringtrain's launcher sets up the processes (--nproc-per-node, --nnodes)",
            "--backend" | "--use-v2" => "ringtrain's pipeline is its own, on uint8 pixels; its policies compute torchvision v2's operations",
            "--ra-reps" if !switch("--ra-sampler") => "without --ra-sampler train.py does not repeat",
            "--ra-magnitude" if given("--auto-augment").flatten().as_deref() != Some("ra") => "used by --auto-augment ra only",
            "--augmix-severity" if given("--auto-augment").flatten().as_deref() != Some("augmix") => "used by --auto-augment augmix only",
            "--model-ema-steps" | "--model-ema-decay" if !switch("--model-ema") => "without --model-ema train.py keeps no average",
            "--lr-warmup-method" | "--lr-warmup-decay" if warmup <= 0.0 => "no warm-up epochs: train.py does not warm up",
            f if SWITCHES.contains(&f) || VALUED.contains(&f) => continue,
            _ => "not a flag of torchvision's train.py",
        };
        let shown = value.as_ref().map_or(flag.clone(), |v| format!("{flag} {v}"));
        dropped.push(format!("{shown}: {why}"));
    }
    if world > 1 {
        notes.push(format!("torchvision's --batch-size {per_process} is per process: the global batch is {per_process} × {world}"));
    }
    Ok(Translation {
        settings,
        world,
        notes,
        dropped,
    })
}

/// The configuration file: the command, how to launch it, the notes and what was left behind
/// as comments, then one key per line with the flag it came from.
pub fn to_toml(t: &Translation, command: &str) -> String {
    let mut s = String::new();
    s += "# torchvision's reference command (references/classification/train.py), as ringtrain's\n";
    s += "# configuration, made by `ringtrain recipe from-torchvision`:\n";
    for line in wrap(command, 94) {
        s += &format!("#   {line}\n");
    }
    s += "#\n";
    match t.world {
        1 => s += "# Run: ringtrain train --config THIS_FILE\n",
        n => s += &format!("# Run on {n} GPUs: ringtrain train --config THIS_FILE --nproc-per-node {n} (on several nodes:\n#     --nnodes N --node-rank I --master-addr HOST0, or launch with torchrun/srun)\n"),
    }
    s += "# On a CPU: add --device cpu (and a smaller --batch-size); ringtrain runs, slowly.\n";
    for n in &t.notes {
        for (k, line) in wrap(n, 90).into_iter().enumerate() {
            s += &format!("# {}{line}\n", if k == 0 { "Note: " } else { "      " });
        }
    }
    if t.dropped.is_empty() {
        s += "# Every flag carried over.\n";
    } else {
        s += "# Not carried over:\n";
        for d in &t.dropped {
            for (k, line) in wrap(d, 90).into_iter().enumerate() {
                s += &format!("#   {}{line}\n", if k == 0 { "" } else { "  " });
            }
        }
    }
    for (key, value, from) in &t.settings {
        s += &format!("{key} = {value}  # {from}\n");
    }
    s
}

/// `text` cut at spaces into lines of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for w in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + w.len() > width {
            lines.push(w.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(w);
        }
    }
    lines
}
