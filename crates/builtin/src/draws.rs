//! Deterministic pseudo-randomness for simulated providers: every draw is a pure function
//! of the run's seed and the action attempt, so a resumed run behaves like the original.
//! The simulation draws its schedules from it too.

/// splitmix64: a tiny, well-mixed hash of one 64-bit value.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A hash of a string, seeded.
pub fn hash_str(seed: u64, s: &str) -> u64 {
    s.bytes().fold(mix(seed), |h, b| mix(h ^ u64::from(b)))
}

/// A stream of uniform draws in [0, 1).
pub struct Draws(u64);

impl Draws {
    /// Draws for one attempt, identified by `key` under `seed`.
    pub fn new(seed: u64, key: &str) -> Self {
        Draws(hash_str(seed, key))
    }
    /// The next draw in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 = mix(self.0);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A draw in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + (self.next_f64() * (hi - lo) as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_spread() {
        let a: Vec<f64> = (0..5)
            .map({
                let mut d = Draws::new(7, "k");
                move |_| d.next_f64()
            })
            .collect();
        let b: Vec<f64> = (0..5)
            .map({
                let mut d = Draws::new(7, "k");
                move |_| d.next_f64()
            })
            .collect();
        assert_eq!(a, b);
        let mut d = Draws::new(1, "x");
        let mean = (0..10_000).map(|_| d.next_f64()).sum::<f64>() / 10_000.0;
        assert!((0.45..0.55).contains(&mean), "{mean}");
        assert!((0..1000).map(|_| d.range(10, 20)).all(|v| (10..20).contains(&v)));
    }
}
