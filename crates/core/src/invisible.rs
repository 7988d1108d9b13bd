//! Characters no new name or holder description may carry: those of
//! Unicode general category Cf (format: bidi overrides and isolates,
//! zero-width spaces and joiners, the byte order mark) and the other
//! Default_Ignorable_Code_Point code points (variation selectors, Hangul
//! fillers, tags). Shown, they are invisible or reorder the text around
//! them, so `rtl:<U+202E>gnp.exe` reads `rtl:exe.png` and `a<U+200B>b`
//! looks like `ab`: an operator could release or fence the wrong resource.
//! The sets come from ICU4X's Unicode data (`icu_properties`); the fence
//! kit's SQL and the Python and Go clients carry the same ranges, checked against
//! [`invisible_ranges`] by `crates/fence/tests/it/sql_names.rs`.

use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory, GeneralCategoryGroup};
use icu_properties::{CodePointMapData, CodePointSetData};

/// Whether `c` is a format character or default-ignorable (see the module).
pub fn is_invisible(c: char) -> bool {
    if c.is_ascii() {
        return false;
    }
    CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
        || CodePointMapData::<GeneralCategory>::new().get(c) == GeneralCategory::Format
}

/// The first such character of `text`, with its byte offset.
pub fn find_invisible(text: &str) -> Option<(usize, char)> {
    if text.is_ascii() {
        return None;
    }
    text.char_indices().find(|(_, c)| is_invisible(*c))
}

/// Every such code point, as sorted, merged, inclusive ranges.
pub fn invisible_ranges() -> Vec<(u32, u32)> {
    let ignorable = CodePointSetData::new::<DefaultIgnorableCodePoint>().iter_ranges();
    let format = CodePointMapData::<GeneralCategory>::new()
        .iter_ranges_for_group(GeneralCategoryGroup::Format);
    let mut all: Vec<(u32, u32)> = ignorable
        .chain(format)
        .map(|r| (*r.start(), *r.end()))
        .collect();
    all.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(all.len());
    for (start, end) in all {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_zero_widths_and_fillers_are_invisible_and_letters_are_not() {
        for c in [
            '\u{202E}', '\u{2066}', '\u{200B}', '\u{200D}', '\u{FEFF}', '\u{00AD}',
        ] {
            assert!(is_invisible(c), "U+{:04X}", u32::from(c));
        }
        for c in ['\u{FE0F}', '\u{3164}', '\u{E0041}', '\u{180B}'] {
            assert!(is_invisible(c), "default-ignorable U+{:04X}", u32::from(c));
        }
        for c in ['a', ':', 'é', 'ß', '日', '\u{00A0}', '😀'] {
            assert!(!is_invisible(c), "U+{:04X}", u32::from(c));
        }
        assert_eq!(find_invisible("zw:a\u{200B}b"), Some((4, '\u{200B}')));
        assert_eq!(find_invisible("plain:ascii"), None);
    }

    #[test]
    fn the_ranges_are_exactly_the_invisible_code_points() {
        let ranges = invisible_ranges();
        let inside = |cp: u32| ranges.iter().any(|(s, e)| (*s..=*e).contains(&cp));
        for cp in (0..=0x10FFFF).filter(|cp| !(0xD800..=0xDFFF).contains(cp)) {
            let c = char::from_u32(cp).expect("a scalar value");
            assert_eq!(inside(cp), is_invisible(c), "U+{cp:04X}");
        }
        assert!(
            ranges.windows(2).all(|w| w[0].1 + 1 < w[1].0),
            "sorted and merged"
        );
    }
}
