//! The documentation's commands stay true to the binary: every `ringtrain <command> --flag` in a
//! code block of README.md or docs/*.md is a flag that command accepts, every option in a
//! markdown table of flags exists, and every repository file a command names exists.
mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

const COMMANDS: [&str; 8] = ["train", "demo", "eval", "predict", "bench", "bench-data", "split", "stats"];

fn doc_files() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            v.push(p);
        }
    }
    v
}

/// Shell commands in fenced code blocks, with `\` continuations joined.
fn code_lines(text: &str) -> Vec<String> {
    let (mut out, mut inside, mut cur) = (Vec::new(), false, String::new());
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        if !inside {
            continue;
        }
        let l = line.trim_end();
        if let Some(stripped) = l.strip_suffix('\\') {
            cur += stripped;
            cur.push(' ');
        } else {
            cur += l;
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

fn help(command: &str, cache: &mut HashMap<String, String>) -> String {
    cache
        .entry(command.to_string())
        .or_insert_with(|| {
            let o = common::ringtrain(&[command, "--help"]);
            assert!(o.status.success());
            String::from_utf8_lossy(&o.stdout).into_owned()
        })
        .clone()
}

#[test]
fn documented_commands_use_existing_flags_and_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cache = HashMap::new();
    let mut checked = 0;
    for doc in doc_files() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for line in code_lines(&text) {
            let command_part = line.split(" #").next().unwrap(); // without a trailing comment
            let words: Vec<&str> = command_part.split_whitespace().collect();
            // `ringtrain <command>` anywhere in the line (after srun, torchrun --no-python, ...).
            let Some(at) = words
                .windows(2)
                .position(|w| w[0].ends_with("ringtrain") && COMMANDS.contains(&w[1]))
            else {
                continue;
            };
            let command = words[at + 1];
            let h = help(command, &mut cache);
            for w in &words[at + 2..] {
                if w.starts_with("--") && w.len() > 2 {
                    let flag = w.split('=').next().unwrap();
                    assert!(
                        h.contains(&format!("{flag} ")) || h.contains(&format!("{flag}\n")),
                        "{}: `ringtrain {command}` has no flag {flag}: {line}",
                        doc.display()
                    );
                    checked += 1;
                }
                if (w.starts_with("recipes/") || w.starts_with("bench/")) && !w.contains('*') {
                    assert!(root.join(w).exists(), "{}: {w} does not exist: {line}", doc.display());
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} documented flags found");
}

#[test]
fn flags_in_the_option_tables_exist() {
    let mut cache = HashMap::new();
    let mut all_help = String::new();
    for c in COMMANDS {
        all_help += &help(c, &mut cache);
    }
    let mut flags = BTreeSet::new();
    for doc in doc_files() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for line in text.lines().filter(|l| l.starts_with("| `--")) {
            let first_cell = line.split('|').nth(1).unwrap();
            for part in first_cell.split('`').filter(|p| p.starts_with("--")) {
                flags.insert(part.split_whitespace().next().unwrap().to_string());
            }
        }
    }
    assert!(flags.len() > 30, "{flags:?}");
    for f in &flags {
        assert!(all_help.contains(&format!("{f} ")) || all_help.contains(&format!("{f}\n")), "no command has {f}");
    }
}
