//! `ringtrain recipe from-torchvision`: torchvision's reference commands as pasted (launchers,
//! `--flag=value`, short forms) become the configuration train.py would run, with train.py's
//! defaults written out, its per-process batch made global and every flag it cannot carry named;
//! recipes/torchvision-*.toml are its output for torchvision's published commands.
mod common;

use std::path::Path;

/// The configuration made of `command` (words as a shell splits them) and what it printed.
fn convert(command: &str) -> (toml::Table, String) {
    let mut args = vec!["recipe".to_string(), "from-torchvision".into(), "--".into()];
    args.extend(command.split_whitespace().map(String::from));
    let o = common::ringtrain(&args);
    assert!(o.status.success(), "{command}: {}", common::text(&o));
    let text = String::from_utf8(o.stdout.clone()).unwrap();
    (text.parse().unwrap_or_else(|e| panic!("{command}: {e}\n{text}")), common::text(&o))
}

fn get<'a>(t: &'a toml::Table, key: &str) -> &'a toml::Value {
    t.get(key).unwrap_or_else(|| panic!("no {key} in {t:#?}"))
}

#[test]
fn the_torchvision_recipes_are_its_output_for_torchvisions_commands() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut made = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("torchvision-") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // The command is the header's indented block after "made by".
        let command: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("made by"))
            .skip(1)
            .take_while(|l| l.starts_with("#   "))
            .map(|l| l.trim_start_matches("#   "))
            .collect();
        let mut args = vec!["recipe".to_string(), "from-torchvision".into(), "--".into()];
        args.extend(command.join(" ").split_whitespace().map(String::from));
        let o = common::ringtrain(&args);
        assert!(o.status.success(), "{name}: {}", common::text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), text, "{name} is not what from-torchvision makes of its command");
        made += 1;
    }
    assert_eq!(made, 5, "ResNet-50 V2, MobileNetV3-Large, ConvNeXt-T, ViT-B/16, EfficientNet-V2-S");
}

#[test]
fn launchers_give_the_global_batch_and_train_py_its_defaults() {
    // torchvision's V2 ResNet-50 command on 8 GPUs: 128 per process.
    let (t, _) = convert(
        "torchrun --nproc_per_node=8 train.py --model resnet50 --batch-size 128 --lr 0.5 --lr-scheduler cosineannealinglr \
         --lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide --epochs 600 --random-erase 0.1 \
         --weight-decay 0.00002 --norm-weight-decay 0.0 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 \
         --train-crop-size 176 --model-ema --val-resize-size 232 --ra-sampler --ra-reps 4",
    );
    for (key, want) in [
        ("batch_size", toml::Value::Integer(1024)),
        ("sched", "cosine".into()),
        ("warmup_epochs", 5.0.into()),
        ("lr_warmup_method", "linear".into()),
        ("lr_warmup_decay", 0.01.into()),
        ("img_size", 176.into()),
        ("val_crop_size", 224.into()),
        ("eval_resize", 232.into()),
        ("ra_sampler", true.into()),
        ("ra_reps", 4.into()),
        ("model_ema", true.into()),
        ("model_ema_steps", 32.into()),
        ("amp", "off".into()),
        ("auto_augment", "ta_wide".into()),
        ("random_erasing", 0.1.into()),
        ("mix_style", "torchvision".into()),
        // Distributed, train.py's samplers shuffle with torch.randperm seeded 0 + epoch.
        ("torch_sampler_seed", 0.into()),
    ] {
        assert_eq!(get(&t, key), &want, "{key}");
    }
    // The older launcher, `=` forms and short flags; 4 processes of 64.
    let (t, _) = convert("python -m torch.distributed.launch --nproc_per_node=4 --use_env train.py --model resnet18 -b 64 -j 4 --wd=0.0005 --amp");
    assert_eq!(get(&t, "batch_size"), &toml::Value::Integer(256));
    assert_eq!(get(&t, "workers"), &toml::Value::Integer(4));
    assert_eq!(get(&t, "weight_decay"), &toml::Value::Float(0.0005));
    assert_eq!(get(&t, "amp"), &toml::Value::String("fp16".into()));
    // Nodes times processes.
    let (t, _) = convert("torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d train.py --model resnet50");
    assert_eq!(get(&t, "batch_size"), &toml::Value::Integer(512));
    // train.py's own defaults where ringtrain's differ: StepLR(30, 0.1), 90 epochs, fp32, 224/256.
    let (t, _) = convert("python train.py --model resnet18");
    for (key, want) in [
        ("batch_size", toml::Value::Integer(32)),
        ("epochs", 90.into()),
        ("lr", 0.1.into()),
        ("momentum", 0.9.into()),
        ("weight_decay", 0.0001.into()),
        ("sched", "step".into()),
        // Its scheduler steps once an epoch.
        ("sched_interval", "epoch".into()),
        ("step_size", 30.into()),
        ("gamma", 0.1.into()),
        ("warmup_epochs", 0.0.into()),
        ("amp", "off".into()),
        ("img_size", 224.into()),
        ("eval_resize", 256.into()),
        ("interpolation", "bilinear".into()),
    ] {
        assert_eq!(get(&t, key), &want, "{key}");
    }
    // One process shuffles with an unseeded RandomSampler: no order to copy.
    assert!(t.get("torch_sampler_seed").is_none(), "{t:#?}");
    // ExponentialLR(g) is StepLR(1, g); sgd_nesterov is SGD with Nesterov; published weights.
    let (t, _) = convert("torchrun --nproc_per_node 2 train.py --model resnet50 --lr-scheduler exponentiallr --lr-gamma 0.97 --opt sgd_nesterov --weights ResNet50_Weights.IMAGENET1K_V2");
    assert_eq!((get(&t, "sched"), get(&t, "step_size"), get(&t, "gamma")), (&"step".into(), &1.into(), &0.97.into()));
    assert_eq!(get(&t, "nesterov"), &true.into());
    assert_eq!(get(&t, "pretrained"), &"torchvision:resnet50.IMAGENET1K_V2".into());
}

#[test]
fn what_cannot_be_carried_is_named_and_bad_commands_are_refused() {
    let (t, printed) = convert(
        "python train.py --model mobilenet_v3_large --opt rmsprop --ra-sampler --device cuda --cache-dataset \
         --foo 3 --test-only --model-ema-steps 16",
    );
    // train.py's RMSprop is torch's with alpha 0.9 and eps 0.0316.
    assert_eq!(
        ["optimizer", "momentum", "rmsprop_alpha", "rmsprop_eps"].map(|k| get(&t, k).clone()),
        ["rmsprop".into(), 0.9.into(), 0.9.into(), 0.0316.into()]
    );
    for needle in [
        // train.py takes its RASampler only when distributed.
        "--ra-sampler: train.py run without a launcher is not distributed",
        "--device cuda: ringtrain takes the GPUs there are",
        "--cache-dataset: nothing to cache",
        "--foo 3: not a flag of torchvision's train.py",
        "--test-only: use ringtrain eval",
        "--model-ema-steps 16: without --model-ema",
    ] {
        assert!(printed.contains(&format!("not carried over: {needle}")), "{needle}: {printed}");
    }
    assert!(t.get("ra_sampler").is_none() && t.get("model_ema").is_none(), "{t:#?}");
    for (command, needle) in [
        ("torchrun --nproc_per_node=8 train_quantization.py --model resnet18", "is not torchvision's references/classification/train.py"),
        ("python train.py --lr-scheduler polylr", "--lr-scheduler polylr"),
        ("python train.py --opt adam", "--opt adam: torchvision's train.py takes sgd, sgd_nesterov, rmsprop or adamw"),
        ("python train.py --lr", "--lr of torchvision's train.py needs a value"),
        ("torchrun --nproc_per_node=gpu train.py", "give the number of processes per node"),
        ("python train.py --amp=1", "--amp of torchvision's train.py takes no value"),
        // A value train would refuse is refused here, before a recipe is written.
        ("python train.py --auto-augment ra --ra-magnitude 40", "--ra-magnitude must be a bin in 0..30"),
    ] {
        let mut args = vec!["recipe".to_string(), "from-torchvision".into(), "--".into()];
        args.extend(command.split_whitespace().map(String::from));
        common::expect_user_error(&args, needle);
    }
    // --out is written whole, and train reads it.
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("r.toml");
    let o = common::ringtrain(&["recipe", "from-torchvision", "--out", out.to_str().unwrap(), "--", "torchrun", "--nproc_per_node=2", "train.py", "--model", "resnet18", "--epochs", "3"]);
    assert!(o.status.success(), "{}", common::text(&o));
    let cfg = ringtrain::config::resolve(Some(ringtrain::config::read_toml(&out).unwrap()), toml::Table::new()).unwrap();
    assert_eq!((cfg.batch_size, cfg.epochs), (64, 3));
}
