//! `ringtrain bench --profile` and `ringtrain trace-table` on the CPU: the trace is a Chrome
//! trace another parser reads, the table's classes add up to the step time a clock measured, and
//! each operator's time in it equals what torch.profiler itself reports for the same trace.
mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;

/// profile.csv's rows of one source: kind → name → ms per step (names summed over classes).
fn csv_figures(path: &Path, source: &str) -> HashMap<String, HashMap<String, f64>> {
    let mut out: HashMap<String, HashMap<String, f64>> = HashMap::new();
    let mut r = csv::Reader::from_path(path).unwrap();
    for row in r.records() {
        let row = row.unwrap();
        if &row[0] != source {
            continue;
        }
        *out.entry(row[1].to_string())
            .or_default()
            .entry(row[2].to_string())
            .or_default() += row[3].parse::<f64>().unwrap();
    }
    out
}

fn within(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn bench_profile_writes_a_chrome_trace_and_a_table_that_adds_up() {
    let dir = tempfile::tempdir().unwrap();
    let prof = dir.path().join("prof");
    let out = ringtrain(&argv(
        "bench --model resnet18-cifar --img-size 32 --batch-size 8 --steps 2 --warmup 1 --device cpu \
         --profile {} --profile-steps 3 --vs-pytorch",
        &[&prof],
    ));
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        !said.contains("ERROR"),
        "Kineto's complaint about no GPU leaked: {said}"
    );
    for line in [
        "convolution forward",
        "convolution backward (data + weight)",
        "idle (nothing running)",
    ] {
        assert!(said.contains(line), "{line} missing:\n{said}");
    }
    // Python's own JSON parser reads both traces as Chrome traces: complete events with the
    // fields the format requires, three steps, operators inside them.
    for trace in [prof.join("trace.json"), prof.join("pytorch/trace.json")] {
        let check = format!(
            r#"import json
t = json.load(open({trace:?}))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
assert all({{"name", "ts", "dur", "pid", "tid"}} <= e.keys() for e in ev)
steps = sorted(e["name"] for e in ev if e["name"].startswith("ProfilerStep#"))
ops = [e for e in ev if e.get("cat") == "cpu_op"]
print(len(steps), steps[0], len(ops) > 100)"#
        );
        assert_eq!(
            run_python_code(&check).trim(),
            "3 ProfilerStep#1 True",
            "{}",
            trace.display()
        );
    }
    assert!(std::fs::read_to_string(prof.join("profile.txt"))
        .unwrap()
        .contains("step measured by the clock"));
    for source in ["ringtrain", "pytorch"] {
        let f = csv_figures(&prof.join("profile.csv"), source);
        let classes: f64 = f["class"].values().sum();
        let step = f["step"]["step"];
        let measured = f["measured"]["step measured by the clock"];
        // The acceptance bound: the trace's classes against the clock, within 5 %.
        assert!(
            within(classes, measured, 0.05),
            "{source}: classes {classes} ms vs measured {measured} ms"
        );
        let conv = f["class"]["convolution forward"] + f["class"]["convolution backward (data + weight)"];
        assert!(conv > 0.5 * step, "{source}: convolutions are {conv} of {step} ms");
        assert!(f["class"]["optimizer, loss scaling"] > 0.0, "{source}");
    }
}

/// For a trace torch.profiler wrote, each operator's self time per step in the table equals
/// torch.profiler's own `key_averages()` self CPU time (to 1 % of it, for every operator above
/// 0.5 % of the step), and the classes add up to the clock's step within 5 %.
#[test]
fn operator_times_equal_torch_profilers_own() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("torch.json");
    let reference: serde_json::Value = serde_json::from_str(&run_python_script(
        "profile_reference.py",
        &[trace.to_str().unwrap(), "3"],
    ))
    .unwrap();
    let csv = dir.path().join("table.csv");
    let out = ringtrain(&argv("trace-table {} --labels torch --csv {}", &[&trace, &csv]));
    assert!(out.status.success(), "{}", text(&out));
    let f = csv_figures(&csv, "torch");
    let step = f["step"]["step"];
    let measured = reference["measured_ms"].as_f64().unwrap();
    assert!(within(step, measured, 0.05), "step {step} ms vs measured {measured} ms");
    let mut compared = 0;
    for (name, want) in reference["self_ms"].as_object().unwrap() {
        let want = want.as_f64().unwrap();
        if want < 0.005 * step {
            continue;
        }
        let got = f["name"].get(name).copied().unwrap_or(0.0);
        assert!(
            within(got, want, 0.01),
            "{name}: {got} ms per step, torch.profiler says {want}"
        );
        compared += 1;
    }
    assert!(compared >= 5, "only {compared} operators compared");
}

#[test]
fn trace_table_refuses_what_is_not_a_profiled_trace() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "not json").unwrap();
    expect_user_error(&argv("trace-table {}", &[&bad]), "not a Chrome trace");
    let unstepped = dir.path().join("unstepped.json");
    std::fs::write(
        &unstepped,
        r#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}"#,
    )
    .unwrap();
    expect_user_error(&argv("trace-table {}", &[&unstepped]), "no ProfilerStep#N scopes");
    expect_user_error(
        &argv("trace-table {}", &[&dir.path().join("missing.json")]),
        "does not exist",
    );
    expect_user_error(&argv("trace-table {} --labels a,b", &[&unstepped]), "--labels");
}
