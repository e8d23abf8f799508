//! The validation images the model gets most wrong, from an evaluation's per-image losses:
//! the highest losses overall and per true class, and the most confused class pairs with their
//! examples (fastai's `plot_top_losses` and `most_confused`). A high loss on a confident
//! prediction is where a wrong label usually shows.
use crate::report::classification::most_confused;
use crate::train::step::eval::EvalResult;

/// One evaluated image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    /// Its index in the evaluated samples.
    pub sample: usize,
    pub target: usize,
    pub pred: usize,
    /// Cross-entropy of the true class.
    pub loss: f32,
    /// Softmax probability of the predicted class.
    pub confidence: f32,
}

/// A true class mistaken for a predicted one `count` times; `examples` highest loss first.
#[derive(Debug, Clone)]
pub struct Pair {
    pub target: usize,
    pub pred: usize,
    pub count: usize,
    pub examples: Vec<Entry>,
}

#[derive(Debug, Clone, Default)]
pub struct Worst {
    /// Highest loss first.
    pub overall: Vec<Entry>,
    /// Per true class, highest loss first.
    pub per_class: Vec<Vec<Entry>>,
    /// Most confused first.
    pub pairs: Vec<Pair>,
}

/// How many of each the page and TensorBoard show.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub overall: usize,
    pub per_class: usize,
    pub pairs: usize,
    pub per_pair: usize,
}

impl Counts {
    /// The run report's: the top 50 overall, 5 per class, the 10 most confused pairs with 4
    /// examples each.
    pub const PAGE: Counts = Counts {
        overall: 50,
        per_class: 5,
        pairs: 10,
        per_pair: 4,
    };
}

/// Every evaluated image, highest loss first (ties: lower sample index first). Empty when the
/// evaluation kept no per-image losses (a checkpoint from before they were kept).
pub fn by_loss(ev: &EvalResult) -> Vec<Entry> {
    if ev.losses.len() != ev.targets.len() || ev.indices.len() != ev.targets.len() {
        return Vec::new();
    }
    let mut all: Vec<Entry> = (0..ev.targets.len())
        .map(|j| Entry {
            sample: ev.indices[j],
            target: ev.targets[j] as usize,
            pred: ev.preds[j] as usize,
            loss: ev.losses[j],
            confidence: ev.confidence.get(j).copied().unwrap_or(f32::NAN),
        })
        .collect();
    all.sort_by(|a, b| b.loss.total_cmp(&a.loss).then(a.sample.cmp(&b.sample)));
    all
}

impl Worst {
    /// `confusion`: the evaluation's confusion matrix (`confusion[true][pred]`), for the pairs.
    pub fn of(ev: &EvalResult, confusion: &[Vec<usize>], n: Counts) -> Worst {
        let all = by_loss(ev);
        let mut per_class = vec![Vec::new(); confusion.len()];
        for e in &all {
            if per_class[e.target].len() < n.per_class {
                per_class[e.target].push(*e);
            }
        }
        let pairs = most_confused(confusion, n.pairs)
            .into_iter()
            .map(|(target, pred, count)| Pair {
                target,
                pred,
                count,
                examples: all.iter().filter(|e| (e.target, e.pred) == (target, pred)).take(n.per_pair).copied().collect(),
            })
            .collect();
        Worst {
            overall: all.iter().take(n.overall).copied().collect(),
            per_class,
            pairs,
        }
    }

    /// Whether there is any image to show.
    pub fn is_empty(&self) -> bool {
        self.overall.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::classification::ClassificationReport;

    #[test]
    fn highest_losses_overall_per_class_and_per_pair() {
        // 6 images of 3 classes; image j is sample 10 + j.
        let ev = EvalResult {
            targets: vec![0, 0, 1, 1, 2, 2],
            preds: vec![1, 0, 0, 1, 0, 2],
            losses: vec![2.0, 0.1, 3.0, 0.2, 1.0, 0.3],
            confidence: vec![0.8, 0.9, 0.95, 0.7, 0.5, 0.6],
            indices: (10..16).collect(),
            ..Default::default()
        };
        let classes: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let confusion = ClassificationReport::new(&classes, &ev.targets, &ev.preds).confusion;
        let w = Worst::of(
            &ev,
            &confusion,
            Counts {
                overall: 3,
                per_class: 1,
                pairs: 2,
                per_pair: 1,
            },
        );
        let samples = |v: &[Entry]| v.iter().map(|e| e.sample).collect::<Vec<_>>();
        assert_eq!(samples(&w.overall), [12, 10, 14]);
        assert_eq!(w.overall[0].confidence, 0.95);
        assert_eq!(w.per_class.iter().map(|c| samples(c)).collect::<Vec<_>>(), [vec![10], vec![12], vec![14]]);
        // Three pairs of one each, ties by (true, predicted): 0→1, 1→0 (2→0 left out).
        assert_eq!(w.pairs.iter().map(|p| (p.target, p.pred, p.count)).collect::<Vec<_>>(), [(0, 1, 1), (1, 0, 1)]);
        assert_eq!(samples(&w.pairs[1].examples), [12]);
        assert!(Worst::of(&EvalResult { targets: vec![0], preds: vec![0], ..Default::default() }, &[vec![1]], Counts::PAGE).is_empty());
    }
}
