//! The gradient all-reduce overlaps backward: two Gloo ranks (threads of this process) take a
//! step of a small ResNet with several buckets, and the DDP layer's event log shows the first
//! bucket launched before backward has produced the last gradient; launches go in bucket
//! order; the averaged gradients equal the mean of the ranks' own gradients, and those of the
//! all-reduce started after backward; a micro-batch that does not end a step launches nothing.
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Duration;

use ringtrain::dist::ddp::{Ddp, WirePrecision};
use ringtrain::dist::launcher::free_port;
use ringtrain::dist::process_group::{Backend, ProcessGroup};
use ringtrain::dist::reducer::{Event, Timed};
use ringtrain::model::{Model, ModelKind};
use tch::{Device, Kind, Reduction, Tensor};

/// Small buckets, so the small ResNet has several.
const BUCKET_MB: f64 = 0.1;

/// libtorch's generator is global to the process, and the ranks (and tests) are threads: each
/// draw happens under a lock, right after its seed.
fn seeded<T>(seed: i64, draw: impl FnOnce() -> T) -> T {
    static RNG: Mutex<()> = Mutex::new(());
    let _only_me = RNG.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    draw()
}

/// What a rank saw.
struct RankRun {
    /// Per backward, its events.
    events: Vec<Vec<Timed>>,
    /// The gradients after the step's all-reduce, in parameter order.
    averaged: Vec<Tensor>,
    /// This rank's own gradients of the same micro-batches (summed), before any all-reduce.
    local: Vec<Tensor>,
    buckets: Vec<Vec<usize>>,
}

/// `micro` backward passes of 4 images each (different images per rank and micro-batch), the
/// last one ending the step.
fn rank(rank: usize, port: u16, overlap: bool, micro: usize) -> RankRun {
    let pg = ProcessGroup::new(
        Backend::Gloo,
        "127.0.0.1",
        port,
        rank,
        2,
        Duration::from_secs(60),
        Device::Cpu,
    )
    .unwrap();
    let model = seeded(0, || Model::new(ModelKind::ResNet10Tiny, 3, Device::Cpu)); // the same on both ranks
    let params: Vec<Tensor> = model.trainable().into_iter().map(|(_, t)| t).collect();
    let loss_of = |m: usize| {
        let (x, y) = seeded(100 + 10 * rank as i64 + m as i64, || {
            let x = Tensor::randn([4, 3, 32, 32], (Kind::Float, Device::Cpu));
            (x, Tensor::randint(3, [4], (Kind::Int64, Device::Cpu)))
        });
        model.forward(&x, true).cross_entropy_loss::<Tensor>(&y, None, Reduction::Mean, -100, 0.0)
    };
    // The rank's own gradients, through autograd.grad (which leaves .grad alone).
    let mut local: Vec<Tensor> = params.iter().map(|p| p.zeros_like()).collect();
    for m in 0..micro {
        let g = Tensor::run_backward(&[loss_of(m)], &params, false, false);
        for (l, g) in local.iter_mut().zip(g) {
            *l += g;
        }
    }
    let ddp = Ddp::new(Rc::new(pg), &params, BUCKET_MB, WirePrecision::Off, overlap).unwrap();
    ddp.zero_grad();
    let mut events = Vec::new();
    for m in 0..micro {
        let last = m + 1 == micro;
        ddp.begin_backward(last).unwrap();
        loss_of(m).backward();
        if last {
            ddp.finish_grad_sync(true).unwrap();
        }
        events.push(ddp.last_events());
    }
    RankRun {
        events,
        averaged: params.iter().map(|p| p.grad().copy()).collect(),
        local,
        buckets: ddp.buckets().to_vec(),
    }
}

/// Tensors cross threads as plain data.
type Plain = Vec<(Vec<f32>, Vec<i64>)>;

fn plain(ts: &[Tensor]) -> Plain {
    ts.iter().map(|t| (Vec::<f32>::try_from(t.reshape([-1])).unwrap(), t.size())).collect()
}

fn tensors(p: &Plain) -> Vec<Tensor> {
    p.iter().map(|(v, s)| Tensor::from_slice(v).view(s.as_slice())).collect()
}

fn two_ranks(overlap: bool, micro: usize) -> [RankRun; 2] {
    let port = free_port().unwrap();
    let other = std::thread::spawn(move || {
        let r = rank(1, port, overlap, micro);
        (r.events, plain(&r.averaged), plain(&r.local), r.buckets)
    });
    let r0 = rank(0, port, overlap, micro);
    let (events, averaged, local, buckets) = other.join().unwrap();
    let r1 = RankRun {
        events,
        averaged: tensors(&averaged),
        local: tensors(&local),
        buckets,
    };
    [r0, r1]
}

/// Both ranks hold the mean of the ranks' own gradients (to float rounding of the sum).
fn check_average(r: &[RankRun; 2]) {
    for i in 0..r[0].averaged.len() {
        let want = (&r[0].local[i] + &r[1].local[i]) * 0.5;
        let scale = want.abs().max().double_value(&[]).max(1e-12);
        for got in [&r[0].averaged[i], &r[1].averaged[i]] {
            let d = (got - &want).abs().max().double_value(&[]) / scale;
            assert!(d <= 1e-6, "parameter {i}: the average differs from the ranks' mean by {d:.1e} of its size");
        }
    }
}

fn position(events: &[Timed], want: impl Fn(&Event) -> bool) -> Vec<usize> {
    events.iter().enumerate().filter(|(_, e)| want(&e.event)).map(|(i, _)| i).collect()
}

fn launches(events: &[Timed]) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| match e.event {
            Event::Launch(b) => Some(b),
            _ => None,
        })
        .collect()
}

#[test]
fn buckets_are_all_reduced_during_backward_in_bucket_order() {
    let [r0, r1] = two_ranks(true, 1);
    let nb = r0.buckets.len();
    assert!(nb >= 4, "the test needs several buckets, got {nb}");
    for r in [&r0, &r1] {
        let ev = &r.events[0];
        let ready = position(ev, |e| matches!(e, Event::GradReady(_)));
        let launched = position(ev, |e| matches!(e, Event::Launch(_)));
        let done = position(ev, |e| *e == Event::BackwardDone);
        assert_eq!(ready.len(), r0.averaged.len(), "every parameter's gradient reported once");
        assert_eq!(launches(ev), (0..nb).collect::<Vec<_>>(), "each bucket once, in order");
        assert!(
            launched[0] < *ready.last().unwrap(),
            "the first bucket was launched at event {} but backward produced its last gradient at event {}: no overlap",
            launched[0],
            ready.last().unwrap()
        );
        assert!(done[0] > *ready.last().unwrap());
        // A bucket is launched only once all its parameters are ready.
        for (b, bucket) in r.buckets.iter().enumerate() {
            let at = position(ev, |e| *e == Event::Launch(b))[0];
            for &p in bucket {
                let ready_at = position(ev, |e| *e == Event::GradReady(p))[0];
                assert!(ready_at < at, "bucket {b} launched before parameter {p} was ready");
            }
        }
        let ms = |i: usize| (ev[i].t_ns - ev[0].t_ns) as f64 / 1e6;
        eprintln!(
            "{nb} buckets: first launched at {:.1} ms, last gradient at {:.1} ms, backward returned at {:.1} ms, all reduced at {:.1} ms",
            ms(launched[0]),
            ms(*ready.last().unwrap()),
            ms(done[0]),
            ms(ev.len() - 1)
        );
    }

    check_average(&[r0, r1]);
}

#[test]
fn the_all_reduce_after_backward_gives_the_same_gradients() {
    let [a0, a1] = two_ranks(false, 1);
    for r in [&a0, &a1] {
        let ev = &r.events[0];
        let done = position(ev, |e| *e == Event::BackwardDone)[0];
        let launched = position(ev, |e| matches!(e, Event::Launch(_)));
        assert_eq!(launched.len(), r.buckets.len());
        assert!(launched.iter().all(|&l| l > done), "launched before backward ended: {ev:?}");
    }
    let [o0, o1] = two_ranks(true, 1);
    for (a, o) in [(&a0, &o0), (&a1, &o1)] {
        for (x, y) in a.averaged.iter().zip(&o.averaged) {
            let d = (x - y).abs().max().double_value(&[]);
            assert!(x.equal(y), "overlapped and after-backward all-reduces differ by {d:e}");
        }
    }
    check_average(&[a0, a1]);
}

#[test]
fn micro_batches_that_do_not_end_a_step_launch_nothing() {
    let r = two_ranks(true, 3);
    for rank in &r {
        for (m, ev) in rank.events.iter().enumerate() {
            let n = launches(ev).len();
            assert!(position(ev, |e| matches!(e, Event::GradReady(_))).len() == rank.averaged.len());
            match m {
                2 => assert_eq!(n, rank.buckets.len(), "the step's last micro-batch"),
                _ => assert_eq!(n, 0, "micro-batch {m} of 3 launched {n} all-reduces"),
            }
        }
    }
    // The accumulated gradients of all three micro-batches, averaged over the ranks.
    check_average(&r);
}
