//! AFL harness of the `machine_toml` target (see `settle_fuzz::machine_toml`).

fn main() {
    afl::fuzz!(|data: &[u8]| settle_fuzz::machine_toml(data));
}
