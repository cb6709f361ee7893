//! numpy's legacy global generator (`np.random.seed`, `np.random.permutation`): MT19937 with
//! numpy's bounded-integer draw, so batches come in the order mlx-lm's `iterate_batches`
//! yields them for the same seed.

const N: usize = 624;
const M: usize = 397;

/// `np.random.RandomState` seeded with an integer (`mt19937_seed`).
#[derive(Clone, Debug)]
pub struct NumpyRandom {
    key: [u32; N],
    pos: usize,
}

impl NumpyRandom {
    pub fn new(seed: u32) -> Self {
        let mut key = [0u32; N];
        let mut s = seed;
        for (i, k) in key.iter_mut().enumerate() {
            *k = s;
            s = 1_812_433_253u32
                .wrapping_mul(s ^ (s >> 30))
                .wrapping_add(i as u32 + 1);
        }
        NumpyRandom { key, pos: N }
    }

    /// The generator's state (numpy's `get_state()`: the 624 key words and the position).
    pub fn state(&self) -> (Vec<u32>, usize) {
        (self.key.to_vec(), self.pos)
    }

    /// A generator in a state given by [`NumpyRandom::state`]; `None` if it is not one.
    pub fn from_state(key: &[u32], pos: usize) -> Option<Self> {
        if pos > N {
            return None;
        }
        Some(NumpyRandom {
            key: key.try_into().ok()?,
            pos,
        })
    }

    fn generate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for i in 0..N {
            let y = (self.key[i] & UPPER) | (self.key[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.key[i] = self.key[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.pos = 0;
    }

    /// `mt19937_next32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.pos >= N {
            self.generate();
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn next_u64(&mut self) -> u64 {
        (u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())
    }

    /// `random_interval(max)`: uniform in `[0, max]` by masked rejection.
    pub fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for sh in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> sh;
        }
        if max <= u64::from(u32::MAX) {
            loop {
                let v = u64::from(self.next_u32()) & mask;
                if v <= max {
                    return v;
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }

    /// `np.random.permutation(n)`: `arange(n)` shuffled by Fisher-Yates from the end.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.interval(i as u64) as usize;
            v.swap(i, j);
        }
        v
    }
}
