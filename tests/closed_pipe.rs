//! A reader that goes away early (`ringtrain models | head -2`): every command ends quietly, and
//! a training run stops as a signal stops it, its checkpoint saved, instead of panicking on a
//! write to the closed pipe.
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;

use common::{make_folder, train_args};

/// Runs ringtrain with its standard output read up to `lines` lines and then closed; returns
/// the exit code and standard error.
fn with_reader_closing_after(args: &[String], lines: usize) -> (Option<i32>, String) {
    with_reader_closing_at(args, |i, _| i + 1 >= lines, lines == 0)
}

/// The same, the reader closing after the first line `last(index, line)` accepts (or at once).
fn with_reader_closing_at(args: &[String], last: impl Fn(usize, &str) -> bool, at_once: bool) -> (Option<i32>, String) {
    let mut child = common::spawn_ringtrain(args);
    let stdout = child.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut i = 0;
    while !at_once {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || last(i, &line) {
            break;
        }
        i += 1;
    }
    drop(reader); // the read end closes: the next write gets EPIPE
    let o = child.wait_with_output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

fn assert_quiet(what: &str, stderr: &str) {
    for bad in ["panicked", "Broken pipe", "backtrace", "internal error"] {
        assert!(!stderr.contains(bad), "{what}: {stderr}");
    }
}

#[test]
fn printing_commands_end_quietly_with_0_when_the_reader_goes() {
    for (line, read) in [
        ("models", 0),
        ("models", 2),
        ("train --help", 0),
        ("--help", 1),
        ("completions bash", 1),
        ("man", 0),
        ("doctor", 1),
        ("--version", 0),
    ] {
        let (code, stderr) = with_reader_closing_after(&words(line), read);
        assert_quiet(line, &stderr);
        assert_eq!(code, Some(0), "`ringtrain {line}` with its reader gone after {read} lines: {stderr}");
    }
}

fn checkpoint_saved(run: &Path) {
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("last/state.json")).expect("last/state.json")).unwrap();
    assert!(state["epoch"].is_number(), "{state}");
    assert!(run.join("last/model.safetensors").is_file());
}

#[test]
fn a_training_whose_reader_goes_stops_at_a_step_with_its_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    make_folder(&data, &["a", "b", "c"], 24);
    let flags = "--model resnet10-tiny --img-size 32 --batch-size 4 --epochs 50 --val-split 0.25 --device cpu \
                 --workers 1 --log-every 1";
    // The reader goes once the loop runs (at its first step's line).
    let at_a_step = |_: usize, line: &str| line.contains(" step ");

    // One process: the write that fails asks the run to stop, as SIGPIPE would.
    let run = d.path().join("run");
    let (code, stderr) = with_reader_closing_at(&train_args(&data, &run, flags), at_a_step, false);
    assert_quiet("train", &stderr);
    assert_eq!(code, Some(128 + libc::SIGPIPE), "{stderr}");
    assert!(stderr.contains("standard output was closed"), "{stderr}");
    checkpoint_saved(&run);
    // Far from its 50 epochs: it stopped, and --resume auto continues it.
    let epochs = std::fs::read_to_string(run.join("metrics.csv")).map_or(0, |s| s.lines().count().saturating_sub(1));
    assert!(epochs < 50, "{epochs} epochs ran");

    // Through the built-in launcher: it stops its workers as SIGTERM does, each saves.
    let run2 = d.path().join("run2");
    let mut args = train_args(&data, &run2, flags);
    args.extend(words("--nproc-per-node 2"));
    let (code, stderr) = with_reader_closing_at(&args, at_a_step, false);
    assert_quiet("train --nproc-per-node 2", &stderr);
    assert_eq!(code, Some(128 + libc::SIGTERM), "{stderr}");
    checkpoint_saved(&run2);

    // A reader gone before the loop starts: the same exit code (not 0: the run did not finish),
    // whichever side of the loop's start the first failed write falls.
    let run3 = d.path().join("run3");
    let (code, stderr) = with_reader_closing_after(&train_args(&data, &run3, flags), 0);
    assert_quiet("train, reader gone at once", &stderr);
    assert_eq!(code, Some(128 + libc::SIGPIPE), "{stderr}");
}
