//! LeNet-5 as in PyTorch's CIFAR-10 tutorial (`conv1`, `conv2`, `fc1`..`fc3`): no BatchNorm and
//! no dropout, so data-parallel training is exactly equivalent to one process on the same global
//! batch (the distributed tests rely on that). Inputs of any size are pooled to 5×5 before `fc1`.
use tch::nn;

use super::{torch_conv2d, torch_linear, LayerMap};

pub fn lenet5(p: &nn::Path, num_classes: i64) -> (nn::FuncT<'static>, LayerMap) {
    let conv1 = torch_conv2d(p / "conv1", 3, 6, 5, 1, 0);
    let conv2 = torch_conv2d(p / "conv2", 6, 16, 5, 1, 0);
    let fc1 = torch_linear(p / "fc1", 16 * 5 * 5, 120);
    let fc2 = torch_linear(p / "fc2", 120, 84);
    let fc3 = torch_linear(p / "fc3", 84, num_classes);
    let net = nn::func_t(move |x, _train| {
        x.apply(&conv1)
            .relu()
            .max_pool2d_default(2)
            .apply(&conv2)
            .relu()
            .max_pool2d_default(2)
            .adaptive_avg_pool2d([5, 5])
            .flatten(1, -1)
            .apply(&fc1)
            .relu()
            .apply(&fc2)
            .relu()
            .apply(&fc3)
    });
    let mut map = LayerMap::new(&[]);
    map.blocks = ["conv1", "conv2", "fc1", "fc2"]
        .iter()
        .map(|n| vec![n.to_string()])
        .collect();
    (net, map)
}
