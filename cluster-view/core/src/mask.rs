//! Bit masks over device and core indices.
//!
//! A server has at most 64 devices (one `u64`) and at most 128 cores ([`CoreMask`], two `u64`s,
//! aligned to 8 bytes so that a [`crate::ServerRecord`] stays at 32 bytes).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The most devices one server may have.
pub const MAX_DEVICES: u32 = 64;
/// The most CPU cores one server may have.
pub const MAX_CORES: u32 = 128;

/// The mask with the lowest `n` bits set (`n <= 64`).
#[inline]
pub fn low_bits(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// The lowest `n` set bits of `mask`, or `None` when it has fewer.
#[inline]
pub fn lowest_set_bits(mask: u64, n: u32) -> Option<u64> {
    if mask.count_ones() < n {
        return None;
    }
    let mut out = 0u64;
    let mut rest = mask;
    for _ in 0..n {
        let bit = rest & rest.wrapping_neg();
        out |= bit;
        rest &= rest - 1;
    }
    Some(out)
}

/// Renders a device mask as a list of indices, e.g. `0,1,4-7`.
pub fn format_indices(mask: u64) -> String {
    format_runs((0..64).filter(|&i| mask >> i & 1 == 1))
}

/// Renders ascending indices as runs, e.g. `0-3,8`; `-` when empty.
fn format_runs(indices: impl Iterator<Item = u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for i in indices {
        run = match run {
            Some((a, b)) if b + 1 == i => Some((a, i)),
            Some((a, b)) => {
                parts.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some((a, b)) = run {
        parts.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
    }
    if parts.is_empty() { "-".to_string() } else { parts.join(",") }
}

/// A set of CPU cores on one server (indices `0..128`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CoreMask(pub [u64; 2]);

impl CoreMask {
    /// No cores.
    pub const EMPTY: CoreMask = CoreMask([0, 0]);

    /// Cores `start..start + count`.
    pub fn range(start: u32, count: u32) -> CoreMask {
        let mut m = CoreMask::EMPTY;
        for c in start..(start + count).min(MAX_CORES) {
            m.insert(c);
        }
        m
    }

    /// Adds core `c`.
    #[inline]
    pub fn insert(&mut self, c: u32) {
        self.0[(c / 64) as usize] |= 1u64 << (c % 64);
    }

    /// Whether core `c` is in the set.
    #[inline]
    pub fn contains(&self, c: u32) -> bool {
        c < MAX_CORES && self.0[(c / 64) as usize] >> (c % 64) & 1 == 1
    }

    /// Number of cores in the set.
    #[inline]
    pub fn count(&self) -> u32 {
        self.0[0].count_ones() + self.0[1].count_ones()
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0 == [0, 0]
    }

    /// Intersection.
    #[inline]
    pub fn and(self, o: CoreMask) -> CoreMask {
        CoreMask([self.0[0] & o.0[0], self.0[1] & o.0[1]])
    }

    /// Union.
    #[inline]
    pub fn or(self, o: CoreMask) -> CoreMask {
        CoreMask([self.0[0] | o.0[0], self.0[1] | o.0[1]])
    }

    /// Difference (`self` without `o`).
    #[inline]
    pub fn without(self, o: CoreMask) -> CoreMask {
        CoreMask([self.0[0] & !o.0[0], self.0[1] & !o.0[1]])
    }

    /// Whether every core of `self` is in `o`.
    #[inline]
    pub fn is_subset_of(self, o: CoreMask) -> bool {
        self.without(o).is_empty()
    }

    /// Whether the two sets share a core.
    #[inline]
    pub fn intersects(self, o: CoreMask) -> bool {
        !self.and(o).is_empty()
    }

    /// The lowest `n` cores of the set, or `None` when it has fewer.
    pub fn lowest(self, n: u32) -> Option<CoreMask> {
        let lo = self.0[0].count_ones();
        if lo >= n {
            return Some(CoreMask([lowest_set_bits(self.0[0], n)?, 0]));
        }
        Some(CoreMask([self.0[0], lowest_set_bits(self.0[1], n - lo)?]))
    }

    /// The core indices, ascending.
    pub fn indices(self) -> impl Iterator<Item = u32> {
        (0..MAX_CORES).filter(move |&c| self.contains(c))
    }

    /// Renders as a list of index ranges, e.g. `0-3,16`.
    pub fn format(self) -> String {
        format_runs(self.indices())
    }
}

impl fmt::Debug for CoreMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CoreMask[{}]", self.format())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_bits_and_format() {
        assert_eq!(lowest_set_bits(0b1011_0110, 3), Some(0b0001_0110));
        assert_eq!(lowest_set_bits(0b1, 2), None);
        assert_eq!(low_bits(64), u64::MAX);
        assert_eq!(format_indices(0b1111_0011), "0-1,4-7");
        assert_eq!(format_indices(0), "-");
        let m = CoreMask::range(60, 8);
        assert_eq!(m.count(), 8);
        assert_eq!(m.format(), "60-67");
        assert_eq!(m.lowest(5).map(|x| x.count()), Some(5));
        assert!(m.lowest(9).is_none());
        assert!(CoreMask::range(0, 4).is_subset_of(CoreMask::range(0, 8)));
    }
}
