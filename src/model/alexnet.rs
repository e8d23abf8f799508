//! AlexNet as torchvision defines it (`features.N`, `classifier.N` names, default init).
use tch::nn;

use super::{torch_conv2d, torch_linear, LayerMap};

/// `dropout`: before each of the first two Linear layers (torchvision: 0.5).
pub fn alexnet(p: &nn::Path, num_classes: i64, dropout: f64) -> (nn::FuncT<'static>, LayerMap) {
    let f = p / "features";
    let conv = |i: usize, cin, cout, k, stride, padding| torch_conv2d(&f / i, cin, cout, k, stride, padding);
    let pool = |x: &tch::Tensor| x.max_pool2d([3, 3], [2, 2], [0, 0], [1, 1], false);
    let features = nn::seq_t()
        .add(conv(0, 3, 64, 11, 4, 2))
        .add_fn(|x| x.relu())
        .add_fn(pool)
        .add(conv(3, 64, 192, 5, 1, 2))
        .add_fn(|x| x.relu())
        .add_fn(pool)
        .add(conv(6, 192, 384, 3, 1, 1))
        .add_fn(|x| x.relu())
        .add(conv(8, 384, 256, 3, 1, 1))
        .add_fn(|x| x.relu())
        .add(conv(10, 256, 256, 3, 1, 1))
        .add_fn(|x| x.relu())
        .add_fn(pool);
    let c = p / "classifier";
    let classifier = nn::seq_t()
        .add_fn_t(move |x, train| x.dropout(dropout, train))
        .add(torch_linear(&c / 1, 256 * 6 * 6, 4096))
        .add_fn(|x| x.relu())
        .add_fn_t(move |x, train| x.dropout(dropout, train))
        .add(torch_linear(&c / 4, 4096, 4096))
        .add_fn(|x| x.relu())
        .add(torch_linear(&c / 6, 4096, num_classes));
    let net = nn::func_t(move |x, train| {
        x.apply_t(&features, train)
            .adaptive_avg_pool2d([6, 6])
            .flatten(1, -1)
            .apply_t(&classifier, train)
    });
    // Each weight layer is a layer of its own for --layer-decay.
    let mut map = LayerMap::new(&[]);
    for name in [
        "features.0",
        "features.3",
        "features.6",
        "features.8",
        "features.10",
        "classifier.1",
        "classifier.4",
    ] {
        map.blocks.push(vec![name.to_string()]);
    }
    (net, map)
}
