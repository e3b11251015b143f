//! The data cache sizes the flash kernel's tiles are sized by ([`caches`]), read once per process
//! from Linux's description of CPU 0 (`/sys/devices/system/cpu/cpu0/cache/index*/`: `level`,
//! `type`, `size`). Where that is missing or unreadable (another OS, a sandbox) the sizes are
//! [`FALLBACK`], common on x86 cores of recent years.

use std::path::Path;
use std::sync::OnceLock;

/// Per-core data cache sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caches {
    /// Level-1 data cache.
    pub l1d: usize,
    /// Level-2 cache.
    pub l2: usize,
}

/// 32 KiB L1d and 1 MiB L2.
pub const FALLBACK: Caches = Caches { l1d: 32 << 10, l2: 1 << 20 };

/// Where Linux describes CPU 0's caches.
const SYSFS: &str = "/sys/devices/system/cpu/cpu0/cache";

/// This CPU's caches (read on first use).
pub fn caches() -> Caches {
    static CACHES: OnceLock<Caches> = OnceLock::new();
    *CACHES.get_or_init(|| read(Path::new(SYSFS)))
}

/// The caches described under `dir` (`index0`, `index1`, …), each size missing there taken from
/// [`FALLBACK`].
fn read(dir: &Path) -> Caches {
    let mut found = Caches { l1d: 0, l2: 0 };
    for i in 0..8 {
        let entry = dir.join(format!("index{i}"));
        let field = |name: &str| std::fs::read_to_string(entry.join(name)).map(|s| s.trim().to_string());
        let (Ok(level), Ok(kind), Ok(size)) = (field("level"), field("type"), field("size")) else { continue };
        let Some(bytes) = parse_size(&size) else { continue };
        match (level.as_str(), kind.as_str()) {
            ("1", "Data" | "Unified") => found.l1d = bytes,
            ("2", "Data" | "Unified") => found.l2 = bytes,
            _ => {}
        }
    }
    Caches {
        l1d: if found.l1d > 0 { found.l1d } else { FALLBACK.l1d },
        l2: if found.l2 > 0 { found.l2 } else { FALLBACK.l2 },
    }
}

/// `"48K"`, `"1024K"`, `"2M"` or a plain byte count, in bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => s.split_at(at),
        None => (s, ""),
    };
    let n: usize = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_their_units() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("K"), None);
    }

    /// Writes a fake sysfs cache description: `(level, type, size)` per index.
    fn fake(entries: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (i, (level, kind, size)) in entries.iter().enumerate() {
            let e = dir.path().join(format!("index{i}"));
            std::fs::create_dir(&e).unwrap();
            for (name, value) in [("level", level), ("type", kind), ("size", size)] {
                std::fs::write(e.join(name), format!("{value}\n")).unwrap();
            }
        }
        dir
    }

    #[test]
    fn a_zen_5_description_reads_as_48k_and_1m() {
        let d = fake(&[
            ("1", "Data", "48K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "1024K"),
            ("3", "Unified", "32768K"),
        ]);
        assert_eq!(read(d.path()), Caches { l1d: 48 << 10, l2: 1 << 20 });
    }

    #[test]
    fn missing_or_garbled_entries_fall_back() {
        let d = fake(&[("1", "Instruction", "32K"), ("2", "Unified", "lots")]);
        assert_eq!(read(d.path()), FALLBACK);
        assert_eq!(read(Path::new("/no/such/folder")), FALLBACK);
    }
}
