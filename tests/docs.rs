//! The documentation's commands stay true to the binary: every `ringtrain <command> --flag` in a
//! code block of README.md or docs/*.md is a flag that command accepts, every option in a
//! markdown table of flags exists, and every repository file a command names exists.
mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

const COMMANDS: [&str; 16] = [
    "train", "demo", "eval", "predict", "bench", "bench-data", "split", "stats", "pack", "convert", "doctor", "compare",
    "lr-find", "trace-table", "show-batch", "export",
];

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
                    // A visible alias closes its flag's help: `[aliases: --wd]`.
                    assert!(
                        [" ", "\n", "]", ","].iter().any(|end| h.contains(&format!("{flag}{end}"))),
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
        // A flag's visible aliases close its help: `[aliases: --wd]`.
        let listed = [" ", "\n", "]", ","].iter().any(|end| all_help.contains(&format!("{f}{end}")));
        assert!(listed, "no command has {f}");
    }
}

/// The `[default: ...]` text of `flag` in a command's help, if it shows one.
fn help_default(help: &str, flag: &str) -> Option<String> {
    let is_option_line = |l: &str| l.starts_with("  -") || l.starts_with("      --");
    let mut lines = help.lines().skip_while(|l| !(is_option_line(l) && l.contains(&format!("{flag} "))));
    let head = lines.next()?;
    let block: String = std::iter::once(head).chain(lines.take_while(|l| !is_option_line(l))).collect();
    let start = block.find("[default: ")? + "[default: ".len();
    let len = block[start..].find(']')?;
    Some(block[start..start + len].to_string())
}

/// Whether the guide's default cell says what the help's `[default: ...]` says: the same number
/// or numbers, the same literal, or (for words) the help's text contains the guide's.
fn same_default(guide: &str, help: &str) -> bool {
    let numbers = |s: &str| s.split(',').map(|x| x.trim().parse::<f64>()).collect::<Result<Vec<_>, _>>();
    if let (Ok(a), Ok(b)) = (numbers(guide), numbers(help)) {
        return a == b;
    }
    match guide {
        "off" => ["false", "none", "off"].iter().any(|w| help.starts_with(w)),
        "—" => help.starts_with("none"),
        _ => help.contains(guide),
    }
}

#[test]
fn the_guides_defaults_are_the_defaults_the_help_shows() {
    let mut cache = HashMap::new();
    let mut checked = 0;
    for doc in doc_files() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let mut in_table = false;
        for line in text.lines() {
            if line.starts_with("| flag | default |") {
                in_table = true;
                continue;
            }
            in_table &= line.starts_with('|');
            if !in_table || !line.starts_with("| `--") {
                continue;
            }
            // `\|` inside a cell is a literal bar (`--resume auto\|DIR`), not a cell boundary.
            let line = line.replace("\\|", "/");
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flags: Vec<&str> = cells[1]
                .split('`')
                .filter(|p| p.starts_with("--"))
                .map(|p| p.split_whitespace().next().unwrap())
                .collect();
            // One default per flag, in the same order; a single flag's default may hold commas.
            let defaults: Vec<&str> = if flags.len() == 1 { vec![cells[2]] } else { cells[2].split(", ").collect() };
            assert_eq!(flags.len(), defaults.len(), "{}: {line}", doc.display());
            for (flag, guide) in flags.iter().zip(&defaults) {
                let guide = guide.trim_matches('`');
                let help = COMMANDS
                    .iter()
                    .find_map(|c| help_default(&help(c, &mut cache), flag))
                    .unwrap_or_else(|| panic!("{flag}: no command's help shows a default ({})", doc.display()));
                assert!(same_default(guide, &help), "{flag}: {} says {guide:?}, --help says {help:?}", doc.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 45, "only {checked} defaults compared");
}

/// The README's model table is `ringtrain models`: the same architectures in the same order
/// with the same parameter counts and input sizes; the guide's `--model` row names each.
#[test]
fn the_model_tables_list_every_architecture() {
    let o = common::ringtrain(&["models"]);
    assert!(o.status.success());
    let listed: Vec<Vec<String>> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty()) // torchvision's weights follow, after a blank line
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert!(listed.len() >= 24, "{listed:?}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let table: Vec<Vec<String>> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| model | parameters | input |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').skip(1).take(3).map(|c| c.trim().trim_matches('`').to_string()).collect())
        .collect();
    let want: Vec<Vec<String>> = listed.iter().map(|r| r[..3].to_vec()).collect();
    assert_eq!(table, want, "README's model table against `ringtrain models`");
    let guide = std::fs::read_to_string(root.join("docs/GUIDE.md")).unwrap();
    let row = guide.lines().find(|l| l.starts_with("| `--model` |")).unwrap();
    for r in &listed {
        assert!(row.contains(&format!("`{}`", r[0])), "the guide's --model row lacks {}", r[0]);
    }
}
