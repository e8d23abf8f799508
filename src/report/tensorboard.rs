//! A TensorBoard event-file writer: the TFRecord framing (length, masked CRC32C, payload, masked
//! CRC32C) around hand-encoded `Event` protobufs. Only what ringtrain logs: scalars, text and
//! images.
//!
//! Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//! Summary    { repeated Value value = 1; }
//! Value      { string tag = 1; float simple_value = 2; Image image = 4; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//! Image      { int32 height = 1; int32 width = 2; int32 colorspace = 3; bytes encoded_image_string = 4; }
//! SummaryMetadata { PluginData plugin_data = 1; }  PluginData { string plugin_name = 1; }
//! TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2; repeated bytes string_val = 8; }
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, ((field as u64) << 3) | wire as u64);
}

fn bytes_field(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(buf, field, 2);
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

fn event(step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    key(&mut e, 1, 1);
    e.extend_from_slice(&wall.to_le_bytes());
    key(&mut e, 2, 0);
    varint(&mut e, step as u64);
    body(&mut e);
    e
}

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `events.out.tfevents.<time>.<host>.ringtrain` in `dir`.
    pub fn create(dir: &Path) -> Result<Self> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let path = dir.join(format!("events.out.tfevents.{secs}.{host}.ringtrain"));
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = EventWriter {
            path,
            out: BufWriter::new(file),
        };
        w.record(&event(0, |e| bytes_field(e, 3, b"brain.Event:2")))?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc(data).to_le_bytes())?;
        Ok(())
    }

    pub fn scalar(&mut self, tag: &str, value: f64, step: i64) -> Result<()> {
        let mut v = Vec::new();
        bytes_field(&mut v, 1, tag.as_bytes());
        key(&mut v, 2, 5);
        v.extend_from_slice(&(value as f32).to_le_bytes());
        let mut summary = Vec::new();
        bytes_field(&mut summary, 1, &v);
        self.record(&event(step, |e| bytes_field(e, 5, &summary)))
    }

    /// A text summary (shown in TensorBoard's Text tab, rendered as Markdown).
    pub fn text(&mut self, tag: &str, text: &str, step: i64) -> Result<()> {
        let mut plugin = Vec::new();
        bytes_field(&mut plugin, 1, b"text");
        let mut metadata = Vec::new();
        bytes_field(&mut metadata, 1, &plugin);
        let mut tensor = Vec::new();
        key(&mut tensor, 1, 0);
        varint(&mut tensor, 7); // DT_STRING
        bytes_field(&mut tensor, 2, &[]); // scalar shape
        bytes_field(&mut tensor, 8, text.as_bytes());
        let mut v = Vec::new();
        bytes_field(&mut v, 1, tag.as_bytes());
        bytes_field(&mut v, 8, &tensor);
        bytes_field(&mut v, 9, &metadata);
        let mut summary = Vec::new();
        bytes_field(&mut summary, 1, &v);
        self.record(&event(step, |e| bytes_field(e, 5, &summary)))
    }

    /// An image summary (TensorBoard's Images tab): a PNG or JPEG file's bytes of
    /// `width`×`height` RGB pixels.
    pub fn image(&mut self, tag: &str, encoded: &[u8], width: u32, height: u32, step: i64) -> Result<()> {
        let mut image = Vec::new();
        for (field, value) in [(1, height as u64), (2, width as u64), (3, 3)] {
            key(&mut image, field, 0);
            varint(&mut image, value);
        }
        bytes_field(&mut image, 4, encoded);
        let mut v = Vec::new();
        bytes_field(&mut v, 1, tag.as_bytes());
        bytes_field(&mut v, 4, &image);
        let mut summary = Vec::new();
        bytes_field(&mut summary, 1, &v);
        self.record(&event(step, |e| bytes_field(e, 5, &summary)))
    }

    /// Flushes buffered events to the OS, so TensorBoard sees them while the run goes on.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().context("writing the TensorBoard event file")
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
        let _ = self.out.get_ref().sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_masked_crc_follow_the_specs() {
        let mut b = Vec::new();
        varint(&mut b, 300);
        assert_eq!(b, vec![0xac, 0x02]);
        // CRC-32C check value of "123456789" is 0xe3069283 (RFC 3720).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }
}
