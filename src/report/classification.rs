//! Per-class precision, recall, F1 and support, with sklearn's `classification_report`
//! definitions: zero division gives 0, macro = unweighted mean, weighted = support-weighted.
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct ClassRow {
    pub name: String,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub support: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassificationReport {
    pub rows: Vec<ClassRow>,
    pub accuracy: f64,
    pub macro_avg: ClassRow,
    pub weighted_avg: ClassRow,
    /// confusion[true][pred]
    pub confusion: Vec<Vec<usize>>,
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl ClassificationReport {
    pub fn new(classes: &[String], targets: &[i64], preds: &[i64]) -> Self {
        let k = classes.len();
        let mut confusion = vec![vec![0usize; k]; k];
        for (&t, &p) in targets.iter().zip(preds) {
            confusion[t as usize][p as usize] += 1;
        }
        let rows: Vec<ClassRow> = (0..k)
            .map(|c| {
                let tp = confusion[c][c];
                let support: usize = confusion[c].iter().sum();
                let predicted: usize = (0..k).map(|t| confusion[t][c]).sum();
                let (precision, recall) = (ratio(tp, predicted), ratio(tp, support));
                let f1 = if precision + recall == 0.0 {
                    0.0
                } else {
                    2.0 * precision * recall / (precision + recall)
                };
                ClassRow {
                    name: classes[c].clone(),
                    precision,
                    recall,
                    f1,
                    support,
                }
            })
            .collect();
        let n: usize = rows.iter().map(|r| r.support).sum();
        let correct: usize = (0..k).map(|c| confusion[c][c]).sum();
        let avg = |name: &str, w: &dyn Fn(&ClassRow) -> f64, total: f64| ClassRow {
            name: name.into(),
            precision: rows.iter().map(|r| w(r) * r.precision).sum::<f64>() / total,
            recall: rows.iter().map(|r| w(r) * r.recall).sum::<f64>() / total,
            f1: rows.iter().map(|r| w(r) * r.f1).sum::<f64>() / total,
            support: n,
        };
        let macro_avg = avg("macro avg", &|_| 1.0, k.max(1) as f64);
        let weighted_avg = avg("weighted avg", &|r| r.support as f64, n.max(1) as f64);
        ClassificationReport {
            accuracy: ratio(correct, n),
            rows,
            macro_avg,
            weighted_avg,
            confusion,
        }
    }

    /// sklearn's `classification_report(..., output_dict=True)`, key for key.
    pub fn to_sklearn_json(&self) -> serde_json::Value {
        let row = |r: &ClassRow| serde_json::json!({"precision": r.precision, "recall": r.recall, "f1-score": r.f1, "support": r.support});
        let mut m = serde_json::Map::new();
        for r in &self.rows {
            m.insert(r.name.clone(), row(r));
        }
        m.insert("accuracy".into(), serde_json::json!(self.accuracy));
        m.insert("macro avg".into(), row(&self.macro_avg));
        m.insert("weighted avg".into(), row(&self.weighted_avg));
        serde_json::Value::Object(m)
    }

    /// The confusion matrix as CSV: header `true_class,<classes>`, one row per true class.
    pub fn confusion_csv(&self) -> String {
        let mut s = String::from("true_class");
        for r in &self.rows {
            s += &format!(",{}", r.name);
        }
        s.push('\n');
        for (r, counts) in self.rows.iter().zip(&self.confusion) {
            s += &r.name;
            for c in counts {
                s += &format!(",{c}");
            }
            s.push('\n');
        }
        s
    }

    /// The `n` largest off-diagonal cells of the confusion matrix (`most_confused`).
    pub fn most_confused(&self, n: usize) -> Vec<(usize, usize, usize)> {
        most_confused(&self.confusion, n)
    }

    /// The report for a terminal: whole up to `max_rows` classes; beyond, the `max_rows` classes
    /// of lowest F1 (ties by index), the averages, and where the whole report is.
    pub fn summary_text(&self, max_rows: usize, whole_in: &str) -> String {
        if self.rows.len() <= max_rows {
            return self.to_text();
        }
        let mut worst: Vec<usize> = (0..self.rows.len()).collect();
        worst.sort_by(|&a, &b| self.rows[a].f1.total_cmp(&self.rows[b].f1).then(a.cmp(&b)));
        worst.truncate(max_rows);
        let lowest = ClassificationReport {
            rows: worst.iter().map(|&i| self.rows[i].clone()).collect(),
            ..self.clone()
        };
        format!(
            "the {max_rows} of {} classes with the lowest F1 (the whole report: {whole_in}):\n{}",
            self.rows.len(),
            lowest.to_text()
        )
    }

    /// The text layout of sklearn's `classification_report(digits=4)`.
    pub fn to_text(&self) -> String {
        let width = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(0)
            .max("weighted avg".len());
        let mut s = format!(
            "{:>width$} {:>9} {:>9} {:>9} {:>9}\n\n",
            "", "precision", "recall", "f1-score", "support"
        );
        let line = |r: &ClassRow| {
            format!(
                "{:>width$} {:>9.4} {:>9.4} {:>9.4} {:>9}\n",
                r.name, r.precision, r.recall, r.f1, r.support
            )
        };
        for r in &self.rows {
            s += &line(r);
        }
        s += &format!(
            "\n{:>width$} {:>9} {:>9} {:>9.4} {:>9}\n",
            "accuracy", "", "", self.accuracy, self.macro_avg.support
        );
        s += &line(&self.macro_avg);
        s += &line(&self.weighted_avg);
        s
    }
}

/// The `n` largest off-diagonal cells of `confusion[true][pred]`, largest first (ties by true,
/// then predicted class): (true class, predicted class, count).
pub fn most_confused(confusion: &[Vec<usize>], n: usize) -> Vec<(usize, usize, usize)> {
    let mut cells: Vec<(usize, usize, usize)> = (confusion.iter().enumerate())
        .flat_map(|(t, row)| row.iter().enumerate().filter(move |&(p, &c)| p != t && c > 0).map(move |(p, &c)| (t, p, c)))
        .collect();
    cells.sort_by(|a, b| b.2.cmp(&a.2).then((a.0, a.1).cmp(&(b.0, b.1))));
    cells.truncate(n);
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_example_with_an_unpredicted_class() {
        let classes: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        // true: a a a b b c ; pred: a a b b b a  (c never predicted -> precision 0 by convention)
        let r = ClassificationReport::new(&classes, &[0, 0, 0, 1, 1, 2], &[0, 0, 1, 1, 1, 0]);
        assert!((r.rows[0].precision - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.rows[0].recall - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.rows[1].precision - 2.0 / 3.0).abs() < 1e-12 && r.rows[1].recall == 1.0);
        assert_eq!((r.rows[2].precision, r.rows[2].recall, r.rows[2].f1), (0.0, 0.0, 0.0));
        assert!((r.accuracy - 4.0 / 6.0).abs() < 1e-12);
        assert!((r.macro_avg.recall - (2.0 / 3.0 + 1.0) / 3.0).abs() < 1e-12);
        assert!((r.weighted_avg.recall - r.accuracy).abs() < 1e-12);
        assert_eq!(r.confusion[2][0], 1);
        assert!(r.to_text().contains("weighted avg"));
        assert_eq!(r.most_confused(5), [(0, 1, 1), (2, 0, 1)]);
        assert_eq!(r.summary_text(3, "x"), r.to_text());
        let short = r.summary_text(1, "report.txt");
        assert!(short.starts_with("the 1 of 3 classes with the lowest F1 (the whole report: report.txt)"), "{short}");
        assert!(short.contains("\n           c ") && !short.contains("\n           a "), "{short}");
        assert!(short.contains(&format!("{:.4}", r.macro_avg.f1)), "the averages of all classes: {short}");
    }
}
