//! A saved checkpoint put to use: `evaluate` on a labelled ImageFolder tree (the report of
//! `ringtrain eval`), `predict` on any images (`ringtrain predict`). Both preprocess as the
//! checkpoint's run evaluated.
pub mod evaluate;
pub mod onnx;
pub mod predict;
