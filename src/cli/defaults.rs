//! Each `train` option's default, shown in its help, comes from the config itself:
//! `TrainConfig::default()` for `train`, the demo's recipe over it for `demo`. It is appended to
//! the help of every argument whose id is a config key, so no default is written twice. The
//! process's arguments are parsed against that command (`parse_args`).
use std::collections::BTreeMap;

use clap::{Command, CommandFactory, FromArgMatches};
use serde_json::Value;

use super::args::Cli;
use crate::config::{TrainConfig, TORCHVISION_NAMES, UNSET_DEFAULTS};

/// The command line as clap describes it, with the defaults of `train` and `demo` in their help.
pub fn command() -> Command {
    show_defaults(Cli::command())
}

/// Parses the process's arguments (`--help` and usage errors come back as clap's errors).
pub fn parse_args() -> Result<Cli, clap::Error> {
    let mut cmd = command();
    let mut matches = cmd.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// `cli` with the defaults in the help of `train` (the config's) and `demo` (its recipe's).
fn show_defaults(cli: Command) -> Command {
    let train = train_defaults();
    let demo = shown_defaults(&super::demo_recipe());
    cli.mut_subcommand("train", |c| annotate(c, &train))
        .mut_subcommand("demo", |c| annotate(c, &demo))
        .mut_subcommand("lr-find", |c| lr_find_help(c, train.clone()))
        .mut_subcommand("show-batch", |c| show_batch_help(c, train))
}

/// `show-batch` takes train's flags with train's defaults, but --out is the picture.
fn show_batch_help(cmd: Command, mut defaults: BTreeMap<String, String>) -> Command {
    defaults.insert("out".into(), super::show_batch::DEFAULT_OUT.into());
    let cmd = cmd
        .mut_arg("out", |a| a.help("The PNG to write"))
        .mut_arg("nproc_per_node", |a| a.help("Refused above 1: show-batch draws rank 0's batch in one process"));
    annotate(cmd, &defaults)
}

/// `lr-find` takes train's flags with train's defaults, but --out and --lr are its own.
fn lr_find_help(cmd: Command, mut defaults: BTreeMap<String, String>) -> Command {
    defaults.insert("out".into(), super::lr_find::DEFAULT_OUT.into());
    defaults.remove("lr");
    let cmd = cmd
        .mut_arg("out", |a| {
            a.help("Where lr_find.csv and lr_find.png go; never a training run's directory")
        })
        .mut_arg("lr", |a| a.help("Not used: the test sets the LR; the suggested command replaces it"))
        .mut_arg("nproc_per_node", |a| a.help("Refused above 1: lr-find runs in one process"));
    annotate(cmd, &defaults)
}

/// `train`'s defaults as its help shows them.
pub fn train_defaults() -> BTreeMap<String, String> {
    let mut train = shown_defaults(&TrainConfig::default());
    // Unset, it follows --model (config::resolve).
    train.insert("img_size".into(), "the model's input size: see ringtrain models".into());
    // torchvision's names of ringtrain's settings show their default.
    for (theirs, ours) in TORCHVISION_NAMES {
        let shown = train[*ours].clone();
        train.insert(theirs.to_string(), shown);
    }
    train
}

/// Every config key with its value in `cfg`, as a flag would give it (lists comma-separated).
pub fn shown_defaults(cfg: &TrainConfig) -> BTreeMap<String, String> {
    let Value::Object(map) = serde_json::to_value(cfg).expect("a config serialises") else {
        unreachable!("a config serialises as a map")
    };
    map.iter().map(|(k, v)| (k.clone(), shown(k, v))).collect()
}

fn shown(key: &str, v: &Value) -> String {
    match v {
        Value::Null => UNSET_DEFAULTS
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("none", |(_, meaning)| meaning)
            .to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "none".into(),
        Value::Array(a) => a.iter().map(|v| shown(key, v)).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

/// Appends `[default: …]` to the help of each argument that is a key of `defaults` and has no
/// default of clap's own.
fn annotate(cmd: Command, defaults: &BTreeMap<String, String>) -> Command {
    cmd.mut_args(|arg| match defaults.get(arg.get_id().as_str()) {
        Some(d) if arg.get_default_values().is_empty() => {
            let help = match arg.get_help() {
                Some(h) => format!("{h} [default: {d}]"),
                None => format!("[default: {d}]"),
            };
            arg.help(help)
        }
        _ => arg,
    })
}

#[cfg(test)]
mod tests {
    use clap::{Args, FromArgMatches};

    use super::*;
    use crate::cli::args::{Command as Sub, DistArgs, FetchArgs};

    fn subcommand(name: &str) -> Command {
        command().find_subcommand(name).unwrap().clone()
    }

    fn parse(argv: &[&str]) -> Cli {
        let m = command()
            .try_get_matches_from([&["ringtrain"], argv].concat())
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        Cli::from_arg_matches(&m).unwrap()
    }

    fn train_config(argv: &[&str]) -> TrainConfig {
        match parse(&[&["train"], argv].concat()).command {
            Some(Sub::Train(a)) => super::super::train_config(&a).unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_config_key_is_a_train_flag_whose_help_shows_its_default() {
        let train = subcommand("train");
        for (key, shown) in train_defaults() {
            let arg = train
                .get_arguments()
                .find(|a| a.get_id() == key.as_str())
                .unwrap_or_else(|| panic!("no flag for the config key {key}"));
            assert_eq!(arg.get_long(), Some(key.replace('_', "-").as_str()));
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(help.ends_with(&format!("[default: {shown}]")), "--{key}: {help:?}");
        }
        let text = subcommand("train").render_long_help().to_string();
        assert!(
            text.contains("[default: 30]") && text.contains("[default: val-crop-size / 0.875]"),
            "{text}"
        );
    }

    #[test]
    fn every_train_flag_is_a_config_key_but_the_launch_and_cache_flags_config_and_resume() {
        let defaults = shown_defaults(&TrainConfig::default());
        // Where and how the job runs on this machine, not what it trains: not recorded.
        let ids = |c: Command| c.get_arguments().map(|a| a.get_id().to_string()).collect::<Vec<_>>();
        let launch = [
            ids(DistArgs::augment_args(Command::new("launch"))),
            ids(FetchArgs::augment_args(Command::new("fetch"))),
        ]
        .concat();
        let mut seen = 0;
        for arg in subcommand("train").get_arguments() {
            let id = arg.get_id().as_str();
            let torchvision_name = TORCHVISION_NAMES.iter().any(|(theirs, _)| *theirs == id);
            if ["config", "resume", "help", "quiet"].contains(&id) || torchvision_name || launch.iter().any(|l| l == id) {
                continue;
            }
            assert!(defaults.contains_key(id), "--{id} is not a config key");
            seen += 1;
        }
        assert_eq!(seen, defaults.len());
        let json = serde_json::to_value(TrainConfig::default()).unwrap();
        for (key, _) in UNSET_DEFAULTS {
            assert_eq!(json[key], Value::Null, "{key} is set by default");
        }
    }

    #[test]
    fn the_default_shown_is_the_default_a_flag_gives() {
        let default = TrainConfig::default().to_toml().unwrap();
        let json = serde_json::to_value(TrainConfig::default()).unwrap();
        for (key, shown) in shown_defaults(&TrainConfig::default()) {
            let value = &json[&key];
            if value.is_null() || value.as_array().is_some_and(|a| a.is_empty()) {
                continue; // unset: no value to give
            }
            let flag = format!("--{}", key.replace('_', "-"));
            let cfg = train_config(&[&flag, &shown]);
            assert_eq!(cfg.to_toml().unwrap(), default, "{flag} {shown}");
        }
    }

    #[test]
    fn the_demo_shows_and_takes_its_recipe_defaults() {
        let demo = |argv: &[&str]| match parse(&[&["demo"], argv].concat()).command {
            Some(Sub::Demo(a)) => super::super::demo_config(&a).unwrap().to_toml().unwrap(),
            _ => unreachable!(),
        };
        let recipe = shown_defaults(&super::super::demo_recipe());
        assert_eq!((recipe["epochs"].as_str(), recipe["out"].as_str()), ("15", "runs/demo"));
        let plain = demo(&[]);
        for arg in subcommand("demo").get_arguments() {
            let id = arg.get_id().as_str();
            if ["help", "quiet", "seed"].contains(&id) {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                help.ends_with(&format!("[default: {}]", recipe[id])),
                "--{id}: {help:?}"
            );
            assert_eq!(demo(&[&format!("--{id}"), &recipe[id]]), plain, "--{id}");
        }
    }
}
