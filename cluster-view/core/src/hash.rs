//! A small, stable state hash (FNV-1a, 64-bit) so that replicas and replays can be compared.
//! Unlike `std`'s `DefaultHasher`, its output is fixed across Rust versions and platforms.

/// FNV-1a over explicitly written fields.
#[derive(Debug, Clone)]
pub struct StateHasher(u64);

impl Default for StateHasher {
    fn default() -> Self {
        StateHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl StateHasher {
    /// Mixes bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// Mixes a `u64`.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// Mixes a string (length-prefixed).
    pub fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}
