//! AFL harness of the `guard` target (see `settle_fuzz::guard`).

fn main() {
    afl::fuzz!(|data: &[u8]| settle_fuzz::guard(data));
}
