//! AFL harness of the `stored_json` target (see `settle_fuzz::stored_json`).

fn main() {
    afl::fuzz!(|data: &[u8]| settle_fuzz::stored_json(data));
}
