//! Which font draws the pictures' text. Class names (and run names) come in any script (Chinese weed names,
//! Cyrillic, Arabic, accents); the DejaVu Sans compiled into the binary covers Latin, Greek and
//! Cyrillic but no CJK, whose characters it would draw as empty boxes. So for text with
//! characters it lacks, the system's fonts are searched: fontconfig's own ranking
//! (`fc-match -s` for a sans-serif with those characters), or the usual font folders when
//! fontconfig's tools are missing. Each candidate is checked glyph by glyph; the first with every
//! character wins. When none has them all, one warning line says which characters show as boxes.
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{LazyLock, Mutex};

use ab_glyph::{Font, FontRef};
use plotters::style::FontStyle;

/// The family name of the embedded DejaVu Sans.
pub const EMBEDDED: &str = "sans-serif";

/// System font files looked at, at most, for one set of characters.
const MAX_CANDIDATES: usize = 40;

#[derive(Default)]
struct Registry {
    embedded: bool,
    /// Family registered with plotters for a font file.
    families: HashMap<PathBuf, &'static str>,
    /// The family chosen for a set of characters (their string), and the characters it lacks.
    chosen: HashMap<String, (&'static str, Vec<char>)>,
    warned: bool,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

/// The embedded font's family, registered with plotters on first use.
pub fn embedded() -> &'static str {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    ensure_embedded(&mut reg);
    EMBEDDED
}

fn ensure_embedded(reg: &mut Registry) {
    if !reg.embedded {
        let _ = plotters::style::register_font(EMBEDDED, FontStyle::Normal, dejavu::sans::regular());
        reg.embedded = true;
    }
}

/// A font family that draws every character of `texts` (and ASCII, for the numbers and axis
/// titles drawn beside them): the embedded one when it can, else a system font. When none has
/// them all, the one lacking fewest, and one warning line (once a process).
pub fn family_for<'a>(texts: impl IntoIterator<Item = &'a str>) -> &'static str {
    let (family, gaps) = choose(texts);
    if let Some(line) = warning(&gaps) {
        let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        if !reg.warned {
            reg.warned = true;
            eprintln!("{line}");
        }
    }
    family
}

/// The warning for characters no font has, if any.
fn warning(gaps: &[char]) -> Option<String> {
    if gaps.is_empty() {
        return None;
    }
    let shown: String = gaps.iter().take(12).collect();
    let more = if gaps.len() > 12 { format!(" and {} more", gaps.len() - 12) } else { String::new() };
    Some(format!(
        "warning: no font on this machine draws the characters {shown}{more} (in class or run names): the pictures show them as boxes (install a font that has them, e.g. Debian's fonts-noto-cjk for Chinese, Japanese and Korean)"
    ))
}

/// `family_for`'s choice, and the characters its font lacks.
fn choose<'a>(texts: impl IntoIterator<Item = &'a str>) -> (&'static str, Vec<char>) {
    let chars: BTreeSet<char> = texts
        .into_iter()
        .flat_map(str::chars)
        .chain(' '..='~')
        .filter(|c| !c.is_control() && !c.is_whitespace())
        .collect();
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    ensure_embedded(&mut reg);
    let embedded_font = FontRef::try_from_slice(dejavu::sans::regular()).expect("the embedded font parses");
    let lacking = missing(&embedded_font, &chars);
    if lacking.is_empty() {
        return (EMBEDDED, lacking);
    }
    let key: String = chars.iter().collect();
    if let Some(chosen) = reg.chosen.get(&key) {
        return chosen.clone();
    }
    // The candidate lacking fewest characters; the first one lacking none ends the search.
    let mut best: Option<(Vec<char>, PathBuf, Vec<u8>)> = None;
    for path in candidates(&lacking) {
        let Ok(bytes) = std::fs::read(&path) else { continue };
        let Ok(font) = FontRef::try_from_slice(&bytes) else { continue };
        let gaps = missing(&font, &chars);
        let done = gaps.is_empty();
        if gaps.len() < best.as_ref().map_or(lacking.len(), |b| b.0.len()) {
            best = Some((gaps, path, bytes));
        }
        if done {
            break;
        }
    }
    let (gaps, family) = match best {
        Some((gaps, path, bytes)) => {
            let family = register_file(&mut reg, path, bytes);
            (gaps, family)
        }
        None => (lacking, EMBEDDED),
    };
    reg.chosen.insert(key, (family, gaps.clone()));
    (family, gaps)
}

/// The characters of `chars` that `font` has no glyph for.
fn missing(font: &FontRef, chars: &BTreeSet<char>) -> Vec<char> {
    chars.iter().copied().filter(|&c| font.glyph_id(c).0 == 0).collect()
}

/// Registers a font file's bytes with plotters (which keeps them for the process) under a
/// family name of its own.
fn register_file(reg: &mut Registry, path: PathBuf, bytes: Vec<u8>) -> &'static str {
    if let Some(&family) = reg.families.get(&path) {
        return family;
    }
    let family: &'static str = Box::leak(format!("ringtrain-font-{}", reg.families.len() + 1).into_boxed_str());
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    if plotters::style::register_font(family, FontStyle::Normal, bytes).is_err() {
        return EMBEDDED;
    }
    reg.families.insert(path, family);
    family
}

/// Font files that may have `chars`, best first: fontconfig's ranking of sans-serif fonts for
/// them, or, without fontconfig's tools, the font folders' files (sans-serif regular first).
/// Only a collection's first face is usable (plotters reads face 0).
fn candidates(chars: &[char]) -> Vec<PathBuf> {
    let charset: Vec<String> = chars.iter().map(|&c| format!("{:x}", c as u32)).collect();
    let pattern = format!("sans-serif:style=Regular:charset={}", charset.join(" "));
    let ranked = Command::new("fc-match")
        .args(["-s", "--format", "%{file}|%{index}\n", &pattern])
        .output();
    let mut files: Vec<PathBuf> = match ranked {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix("|0"))
            .map(PathBuf::from)
            .collect(),
        _ => font_folder_files(),
    };
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.clone()));
    files.truncate(MAX_CANDIDATES);
    files
}

fn font_folder_files() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut roots = vec![PathBuf::from("/usr/share/fonts"), PathBuf::from("/usr/local/share/fonts")];
    roots.extend(home.iter().flat_map(|h| [h.join(".local/share/fonts"), h.join(".fonts")]));
    let mut files = Vec::new();
    for root in roots {
        walk(&root, &mut files, 0);
    }
    // Regular sans-serif faces first: what a label would be drawn in.
    let rank = |p: &Path| {
        let name = p.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        let styled = ["bold", "italic", "oblique", "light", "mono", "serif"].iter().any(|s| name.replace("sans", "").contains(s));
        (styled, !name.contains("sans"), name)
    };
    files.sort_by_key(|p| rank(p));
    files
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth < 4 {
            walk(&p, out, depth + 1);
        } else if p.extension().is_some_and(|x| ["ttf", "otf", "ttc"].contains(&x.to_string_lossy().to_lowercase().as_str())) {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    /// `text` drawn in `family` at 24 px: the dark pixels' mask.
    fn ink(text: &str, family: &str) -> Vec<bool> {
        let (w, h) = (400u32, 40u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            root.draw(&Text::new(text.to_string(), (4, 6), (family, 24).into_font().color(&BLACK)))
                .unwrap();
            root.present().unwrap();
        }
        buf.chunks(3).map(|p| p[0] < 128).collect()
    }

    fn count(mask: &[bool]) -> usize {
        mask.iter().filter(|&&b| b).count()
    }

    /// The 4 Chinese weed names of the guides ringtrain replaces, and 2 Cyrillic ones: each is
    /// drawn with real glyphs, not the missing-glyph box. Boxes are the same for every character,
    /// so names of equal length drawn with boxes have equal ink; drawn with glyphs they differ.
    /// (Needs a font with CJK glyphs on the machine: the set-up installs one.)
    #[test]
    fn chinese_and_cyrillic_names_are_drawn_with_glyphs() {
        let names = ["黑麦草", "野芥菜", "猪殃殃", "繁缕", "Пастушья_сумка", "Марь_белая"];
        let family = family_for(names.iter().copied());
        assert_ne!(family, EMBEDDED, "the embedded font has no CJK: a system font must be chosen");
        // The same number of characters the embedded font lacks: boxes.
        let boxes = |n: usize| ink(&"\u{e000}".repeat(n), embedded());
        let mut drawn = Vec::new();
        for name in names {
            let got = ink(name, family);
            let n = name.chars().count();
            assert!(count(&got) > 50, "{name}: almost no ink ({})", count(&got));
            assert_ne!(got, boxes(n), "{name} is drawn as {n} missing-glyph boxes");
            drawn.push(got);
        }
        for i in 0..names.len() {
            for j in i + 1..names.len() {
                assert_ne!(drawn[i], drawn[j], "{} and {} have the same ink", names[i], names[j]);
            }
        }
        // Drawn with the embedded font, the three-character names are three identical boxes.
        assert_eq!(ink("黑麦草", EMBEDDED), ink("野芥菜", EMBEDDED), "the embedded font lacks CJK");
        assert_eq!(ink("黑麦草", EMBEDDED), boxes(3));
        // Cyrillic needs no system font.
        assert_eq!(family_for(["Пастушья_сумка", "Марь_белая"]), EMBEDDED);
        assert_eq!(family_for(["Black-grass", "Fat_Hen"]), EMBEDDED);
    }

    /// A character no installed font has (Linear B): the best font is still chosen for the
    /// rest, and one line names the character.
    #[test]
    fn characters_no_font_has_are_named_in_one_warning_line() {
        let (family, gaps) = choose(["𐀀 野芥菜"]);
        assert_eq!(gaps, ['𐀀']);
        assert_ne!(family, EMBEDDED, "a font with the Chinese characters is still chosen");
        let line = warning(&gaps).unwrap();
        assert!(line.starts_with("warning: no font on this machine draws the characters 𐀀 (in class or run names)"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(warning(&[]), None);
        assert_eq!(choose(["Fat_Hen"]), (EMBEDDED, vec![]));
    }
}
