//! The list of a data set's samples, kept compact for millions of images: every name (a path
//! under the set's root) in one byte arena, and a label per sample: the name's bytes and 12 more
//! an image, where a `PathBuf` and a `usize` each took 32 bytes and a heap copy of the whole path.
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    text: Vec<u8>,
    /// Where name i ends in `text` (it starts where name i-1 ends).
    ends: Vec<u64>,
    labels: Vec<u32>,
}

impl Catalog {
    pub fn push(&mut self, name: &OsStr, label: usize) {
        self.text.extend_from_slice(name.as_bytes());
        self.ends.push(self.text.len() as u64);
        self.labels.push(label as u32);
    }

    /// Appends every entry of `other`.
    pub fn append(&mut self, other: &Catalog) {
        let base = self.text.len() as u64;
        self.text.extend_from_slice(&other.text);
        self.ends.extend(other.ends.iter().map(|e| e + base));
        self.labels.extend_from_slice(&other.labels);
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn name(&self, i: usize) -> &Path {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Path::new(OsStr::from_bytes(&self.text[start..self.ends[i] as usize]))
    }

    pub fn label(&self, i: usize) -> usize {
        self.labels[i] as usize
    }

    /// Every label `l` becomes `to(l)`.
    pub fn relabel(&mut self, to: impl Fn(usize) -> usize) {
        for l in &mut self.labels {
            *l = to(*l as usize) as u32;
        }
    }
}

impl<P: AsRef<Path>> FromIterator<(P, usize)> for Catalog {
    fn from_iter<I: IntoIterator<Item = (P, usize)>>(items: I) -> Self {
        let mut c = Catalog::default();
        for (p, l) in items {
            c.push(p.as_ref().as_os_str(), l);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_round_trip() {
        let mut a: Catalog = [("x/1.png", 0), ("", 2), ("y/é.jpg", 1)].into_iter().collect();
        assert_eq!(a.len(), 3);
        assert_eq!(a.name(0), Path::new("x/1.png"));
        assert_eq!(a.name(1), Path::new(""));
        assert_eq!(a.name(2), Path::new("y/é.jpg"));
        assert_eq!(a.label(2), 1);
        let b: Catalog = [("z.bmp", 1)].into_iter().collect();
        a.append(&b);
        assert_eq!(a.name(3), Path::new("z.bmp"));
    }
}
